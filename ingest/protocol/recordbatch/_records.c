/*
 * Kafka RecordBatch v2 kernel: batch framing scan, CRC32C, and a record
 * decoder that fills Arrow buffers for a whole fetch in one pass.
 *
 * Python side: ingest/protocol/records.py (the only caller). Every length read
 * from the input is checked against the bytes that remain before it is used:
 * the input is hostile until proven otherwise.
 *
 * The GIL is released while scanning and decoding: output goes to malloc'd
 * buffers, wrapped at the end in a small buffer-protocol object (OwnedBuffer)
 * that pyarrow can borrow without a copy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
#include <nmmintrin.h>
#else
#define HAVE_HW_CRC 0
#endif

/* ------------------------------------------------------------------------ */
/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78)                      */
/* ------------------------------------------------------------------------ */

static uint32_t crc_table[8][256];
static int crc_use_hw = 0;

static void crc_init_software(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slice-by-8 over the raw register (no pre/post inversion). */
static uint32_t crc_software(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
#if PY_LITTLE_ENDIAN
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if HAVE_HW_CRC
/*
 * SSE4.2 path. The crc32 instruction has a 3-cycle latency but a 1-cycle
 * throughput, so long inputs run as three independent lanes whose registers
 * are joined afterwards. Joining uses linearity: the register after lane A
 * then lane B equals shift_B(reg_A) ^ reg_B(started at 0), where shift_B
 * advances a register over |B| zero bytes; shift tables hold that operator
 * split per input byte.
 */
#define CRC_LONG 8192
#define CRC_SHORT 256

static uint32_t crc_shift_long[4][256];
static uint32_t crc_shift_short[4][256];

__attribute__((target("sse4.2"))) static uint32_t crc_hw_zeros(uint32_t crc, size_t n)
{
    uint64_t c = crc;
    for (size_t i = 0; i < n / 8; i++)
        c = _mm_crc32_u64(c, 0);
    return (uint32_t)c;
}

static void crc_build_shift(uint32_t table[4][256], size_t len)
{
    uint32_t basis[32];
    for (int bit = 0; bit < 32; bit++)
        basis[bit] = crc_hw_zeros(1u << bit, len);
    for (int k = 0; k < 4; k++) {
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b))
                    r ^= basis[8 * k + b];
            table[k][v] = r;
        }
    }
}

static inline uint32_t crc_shift(uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hardware(uint32_t crc, const uint8_t *p,
                                                                size_t n)
{
    uint64_t c0 = crc;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    while (n >= 3 * CRC_LONG) {
        uint64_t c1 = 0, c2 = 0, w0, w1, w2;
        const uint8_t *stop = p + CRC_LONG;
        do {
            memcpy(&w0, p, 8);
            memcpy(&w1, p + CRC_LONG, 8);
            memcpy(&w2, p + 2 * CRC_LONG, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < stop);
        c0 = crc_shift(crc_shift_long, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc_shift(crc_shift_long, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * CRC_LONG;
        n -= 3 * CRC_LONG;
    }
    while (n >= 3 * CRC_SHORT) {
        uint64_t c1 = 0, c2 = 0, w0, w1, w2;
        const uint8_t *stop = p + CRC_SHORT;
        do {
            memcpy(&w0, p, 8);
            memcpy(&w1, p + CRC_SHORT, 8);
            memcpy(&w2, p + 2 * CRC_SHORT, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < stop);
        c0 = crc_shift(crc_shift_short, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc_shift(crc_shift_short, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * CRC_SHORT;
        n -= 3 * CRC_SHORT;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = _mm_crc32_u64(c0, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#endif

static void crc_init(void)
{
    crc_init_software();
#if HAVE_HW_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_build_shift(crc_shift_long, CRC_LONG);
        crc_build_shift(crc_shift_short, CRC_SHORT);
        crc_use_hw = 1;
    }
#endif
}

static uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t n, int allow_hw)
{
    uint32_t reg = ~crc;
#if HAVE_HW_CRC
    if (crc_use_hw && allow_hw)
        return ~crc_hardware(reg, p, n);
#endif
    (void)allow_hw;
    return ~crc_software(reg, p, n);
}

/* ------------------------------------------------------------------------ */
/* Output memory: a small cache of freed blocks                              */
/* ------------------------------------------------------------------------ */

/*
 * Output buffers are a few MB per call. Fresh from malloc they come as new
 * mmap'd pages, and faulting those in cost 2-3x the decoding itself; so blocks
 * freed by pyarrow (through OwnedBuffer) are kept for the next call, up to
 * cache_limit bytes. Called only with the GIL held.
 */
#define CACHE_SLOTS 48
#define CACHE_MIN_BLOCK (64 * 1024)

static struct {
    char *data;
    size_t cap;
} block_cache[CACHE_SLOTS];
static int cache_count = 0;
static size_t cache_bytes = 0;
static size_t cache_limit = 64 * 1024 * 1024;

static void cache_remove(int i)
{
    cache_bytes -= block_cache[i].cap;
    memmove(&block_cache[i], &block_cache[i + 1], (size_t)(cache_count - i - 1) * sizeof block_cache[0]);
    cache_count--;
}

/* A block of at least `want` bytes; `*cap` receives its real size. */
static char *block_alloc(size_t want, size_t *cap)
{
    int best = -1;
    for (int i = 0; i < cache_count; i++)
        if (block_cache[i].cap >= want && (best < 0 || block_cache[i].cap < block_cache[best].cap))
            best = i;
    /* a cached block much larger than asked for would pin memory needlessly */
    if (best >= 0 && block_cache[best].cap <= 4 * want + CACHE_MIN_BLOCK) {
        char *data = block_cache[best].data;
        *cap = block_cache[best].cap;
        cache_remove(best);
        return data;
    }
    *cap = want;
    return malloc(want);
}

static void block_free(char *data, size_t cap)
{
    if (!data)
        return;
    if (cap < CACHE_MIN_BLOCK || cap > cache_limit) {
        free(data);
        return;
    }
    while (cache_count && (cache_count == CACHE_SLOTS || cache_bytes + cap > cache_limit)) {
        free(block_cache[0].data); /* oldest first */
        cache_remove(0);
    }
    block_cache[cache_count].data = data;
    block_cache[cache_count].cap = cap;
    cache_count++;
    cache_bytes += cap;
}

static void cache_clear(void)
{
    while (cache_count) {
        free(block_cache[0].data);
        cache_remove(0);
    }
}

/* ------------------------------------------------------------------------ */
/* OwnedBuffer: kernel-owned bytes exposed through the buffer protocol       */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
    size_t cap;
} OwnedBuffer;

static void owned_dealloc(OwnedBuffer *self)
{
    block_free(self->data, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int owned_getbuffer(OwnedBuffer *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 1, flags);
}

static Py_ssize_t owned_length(OwnedBuffer *self) { return self->size; }

static PyBufferProcs owned_as_buffer = {(getbufferproc)owned_getbuffer, NULL};
static PySequenceMethods owned_as_sequence = {.sq_length = (lenfunc)owned_length};

static PyTypeObject OwnedBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ingest.protocol._records.OwnedBuffer",
    .tp_basicsize = sizeof(OwnedBuffer),
    .tp_dealloc = (destructor)owned_dealloc,
    .tp_as_buffer = &owned_as_buffer,
    .tp_as_sequence = &owned_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only bytes owned by the records kernel (borrowed by pyarrow without a copy).",
};

/* Growable output buffer. Allocation (init) and release need the GIL; growth does not. */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} gbuf;

static int gbuf_init(gbuf *b, size_t cap, int zeroed)
{
    if (cap < 16)
        cap = 16;
    b->data = block_alloc(cap, &b->cap);
    b->len = 0;
    if (!b->data) {
        b->cap = 0;
        return 0;
    }
    if (zeroed)
        memset(b->data, 0, b->cap);
    return 1;
}

static int gbuf_grow(gbuf *b, size_t need, int zeroed)
{
    size_t cap = b->cap * 2;
    if (cap < need)
        cap = need;
    char *p = realloc(b->data, cap);
    if (!p)
        return 0;
    if (zeroed)
        memset(p + b->cap, 0, cap - b->cap);
    b->data = p;
    b->cap = cap;
    return 1;
}

/* Ensures room for `extra` more bytes after len. */
static inline int gbuf_reserve(gbuf *b, size_t extra, int zeroed)
{
    size_t need = b->len + extra;
    if (need <= b->cap)
        return 1;
    return gbuf_grow(b, need, zeroed);
}

static void gbuf_free(gbuf *b)
{
    block_free(b->data, b->cap);
    b->data = NULL;
}

/* Hands the bytes to a new OwnedBuffer exposing `size` of them; frees on failure. */
static PyObject *gbuf_release(gbuf *b, size_t size)
{
    OwnedBuffer *obj = PyObject_New(OwnedBuffer, &OwnedBufferType);
    if (!obj) {
        gbuf_free(b);
        return NULL;
    }
    obj->data = b->data;
    obj->size = (Py_ssize_t)size;
    obj->cap = b->cap;
    b->data = NULL;
    return (PyObject *)obj;
}

/* ------------------------------------------------------------------------ */
/* Big-endian reads and Kafka varints                                        */
/* ------------------------------------------------------------------------ */

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

enum { VARINT_OK = 0, VARINT_OVERRUN = 1, VARINT_TOO_LONG = 2 };

/* Kafka's readVarint: at most 5 bytes, bits past 32 dropped, then zigzag. */
static inline int read_varint(const uint8_t **pp, const uint8_t *end, int32_t *out)
{
    const uint8_t *p = *pp;
    if (p < end && !(*p & 0x80)) {
        uint32_t v = *p;
        *out = (int32_t)((v >> 1) ^ (0u - (v & 1)));
        *pp = p + 1;
        return VARINT_OK;
    }
    uint32_t v = 0;
    int shift = 0;
    for (;;) {
        if (p >= end)
            return VARINT_OVERRUN;
        uint32_t b = *p++;
        v |= (b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
        if (shift > 28)
            return VARINT_TOO_LONG;
    }
    *out = (int32_t)((v >> 1) ^ (0u - (v & 1)));
    *pp = p;
    return VARINT_OK;
}

/* Kafka's readVarlong: at most 10 bytes, bits past 64 dropped, then zigzag. */
static inline int read_varlong(const uint8_t **pp, const uint8_t *end, int64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
        if (p >= end)
            return VARINT_OVERRUN;
        uint64_t b = *p++;
        v |= (b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
        if (shift > 63)
            return VARINT_TOO_LONG;
    }
    *out = (int64_t)((v >> 1) ^ (0ull - (v & 1)));
    *pp = p;
    return VARINT_OK;
}

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF). */
static int utf8_valid(const uint8_t *p, size_t n)
{
    const uint8_t *end = p + n;
    while (p < end) {
        if (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (!(w & 0x8080808080808080ull)) {
                p += 8;
                continue;
            }
        }
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if ((size_t)(end - p) <= need)
            return 0;
        if (p[1] < lo || p[1] > hi)
            return 0;
        for (size_t i = 2; i <= need; i++)
            if ((p[i] & 0xC0) != 0x80)
                return 0;
        p += need + 1;
    }
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Batch scan                                                                */
/* ------------------------------------------------------------------------ */

/* Must match _ENTRY_DTYPE in records.py (80 bytes, native byte order). */
typedef struct {
    int64_t start;          /* position in the buffer */
    int64_t size;           /* bytes incl. the 12-byte framing; declared size when incomplete */
    int64_t base_offset;
    int64_t last_offset;    /* valid when has_last_offset */
    int64_t base_timestamp;
    int64_t max_timestamp;
    int64_t producer_id;
    int32_t length;         /* the batch length field as read */
    int32_t record_count;
    uint32_t crc_stored;
    uint32_t crc_computed;
    int16_t attributes;
    int8_t magic;
    uint8_t status;
    uint8_t has_last_offset;
    uint8_t pad[3];
} entry_t;

/* Statuses; records.py maps them to reasons. */
enum {
    ST_OK = 0,
    ST_CRC_MISMATCH = 1,
    ST_OLD_MAGIC = 2,
    ST_UNKNOWN_MAGIC = 3,
    ST_SHORT_BATCH = 4,
    ST_BAD_CODEC = 5,
    ST_BAD_RECORD_COUNT = 6,
    ST_BAD_LAST_OFFSET_DELTA = 7,
    ST_BROKEN_FRAMING = 8,  /* rest of the buffer; always the last entry */
    ST_INCOMPLETE = 9,      /* partial trailing batch; always the last entry */
};

#define LOG_OVERHEAD 12        /* base offset + length */
#define MIN_MESSAGE_LENGTH 14  /* smallest v0 message after the framing */
#define V2_HEADER 61           /* bytes before the first record */
#define V2_MIN_LENGTH (V2_HEADER - LOG_OVERHEAD)
#define CRC_START 21           /* CRC covers attributes .. end of batch */

static int scan_buffer(const uint8_t *buf, size_t len, int check_crc, gbuf *out)
{
    size_t pos = 0;
    while (len - pos >= LOG_OVERHEAD) {
        const uint8_t *p = buf + pos;
        size_t rem = len - pos;
        entry_t e;
        memset(&e, 0, sizeof e);
        e.start = (int64_t)pos;
        e.base_offset = (int64_t)be64(p);
        e.length = (int32_t)be32(p + 8);
        e.magic = rem > 16 ? (int8_t)p[16] : -1;
        int stop = 0;
        if (e.length < MIN_MESSAGE_LENGTH) {
            e.status = ST_BROKEN_FRAMING;
            e.size = (int64_t)rem;
            stop = 1;
        } else if ((uint64_t)e.length + LOG_OVERHEAD > rem) {
            /* A partial batch with a readable but impossible magic is garbage, not a cut. */
            if (rem > 16 && (p[16] > 2)) {
                e.status = ST_BROKEN_FRAMING;
                e.size = (int64_t)rem;
            } else {
                e.status = ST_INCOMPLETE;
                e.size = (int64_t)e.length + LOG_OVERHEAD;
            }
            stop = 1;
        } else {
            size_t total = (size_t)e.length + LOG_OVERHEAD;
            e.size = (int64_t)total;
            if (e.magic == 0 || e.magic == 1) {
                e.status = ST_OLD_MAGIC;
                e.last_offset = e.base_offset;
                e.has_last_offset = 1;
            } else if (e.magic != 2) {
                e.status = ST_UNKNOWN_MAGIC;
            } else if (e.length < V2_MIN_LENGTH) {
                e.status = ST_SHORT_BATCH;
            } else {
                int32_t last_offset_delta = (int32_t)be32(p + 23);
                e.attributes = (int16_t)be16(p + 21);
                e.last_offset = (int64_t)((uint64_t)e.base_offset + (uint64_t)(int64_t)last_offset_delta);
                e.has_last_offset = 1;
                e.base_timestamp = (int64_t)be64(p + 27);
                e.max_timestamp = (int64_t)be64(p + 35);
                e.producer_id = (int64_t)be64(p + 43);
                e.record_count = (int32_t)be32(p + 57);
                e.crc_stored = be32(p + 17);
                if (check_crc)
                    e.crc_computed = crc32c_update(0, p + CRC_START, total - CRC_START, 1);
                if (check_crc && e.crc_computed != e.crc_stored)
                    e.status = ST_CRC_MISMATCH;
                else if ((e.attributes & 7) > 4)
                    e.status = ST_BAD_CODEC;
                else if (e.record_count < 0)
                    e.status = ST_BAD_RECORD_COUNT;
                else if (last_offset_delta < 0)
                    e.status = ST_BAD_LAST_OFFSET_DELTA;
                else
                    e.status = ST_OK;
            }
        }
        if (!gbuf_reserve(out, sizeof e, 0))
            return 0;
        memcpy(out->data + out->len, &e, sizeof e);
        out->len += sizeof e;
        if (stop)
            break;
        pos += (size_t)e.size;
    }
    return 1;
}

/*
 * scan(buf, check_crc) -> (table, summary)
 *   table    one entry_t per framing unit, in buffer order
 *   summary  (complete, valid, attributes_or, min_valid_last_offset, max_last_offset, tail)
 *            complete: entries with intact framing (the tail entry excluded);
 *            valid: of those, ST_OK ones; attributes_or: OR of their attributes;
 *            min_valid_last_offset: over valid entries (None if none);
 *            max_last_offset: over entries with a known last offset (None if none);
 *            tail: status of a trailing broken/incomplete entry, or -1.
 *   The summary lets the caller skip per-batch work in the common case.
 */
static PyObject *py_scan(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int check_crc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*p:scan", &view, &check_crc))
        return NULL;
    gbuf out;
    int ok = gbuf_init(&out, 16 * sizeof(entry_t), 0);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        ok = scan_buffer(view.buf, (size_t)view.len, check_crc, &out);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (!ok) {
        gbuf_free(&out);
        return PyErr_NoMemory();
    }
    const entry_t *entries = (const entry_t *)out.data;
    Py_ssize_t count = (Py_ssize_t)(out.len / sizeof(entry_t)), complete = count, valid = 0;
    int tail = -1, attributes_or = 0, have_min = 0, have_max = 0;
    int64_t min_valid_last = 0, max_last = 0;
    if (count && (entries[count - 1].status == ST_BROKEN_FRAMING ||
                  entries[count - 1].status == ST_INCOMPLETE)) {
        tail = entries[count - 1].status;
        complete--;
    }
    for (Py_ssize_t i = 0; i < complete; i++) {
        const entry_t *e = &entries[i];
        if (e->has_last_offset && (!have_max || e->last_offset > max_last)) {
            max_last = e->last_offset;
            have_max = 1;
        }
        if (e->status != ST_OK)
            continue;
        valid++;
        attributes_or |= (uint16_t)e->attributes;
        if (!have_min || e->last_offset < min_valid_last) {
            min_valid_last = e->last_offset;
            have_min = 1;
        }
    }
    PyObject *table = PyBytes_FromStringAndSize(out.data, (Py_ssize_t)out.len);
    gbuf_free(&out);
    if (!table)
        return NULL;
    PyObject *min_obj = have_min ? PyLong_FromLongLong(min_valid_last) : Py_NewRef(Py_None);
    PyObject *max_obj = have_max ? PyLong_FromLongLong(max_last) : Py_NewRef(Py_None);
    if (!min_obj || !max_obj) {
        Py_DECREF(table);
        Py_XDECREF(min_obj);
        Py_XDECREF(max_obj);
        return NULL;
    }
    return Py_BuildValue("(N(nniNNi))", table, complete, valid, attributes_or, min_obj, max_obj,
                         tail);
}

/* ------------------------------------------------------------------------ */
/* Record decoding                                                           */
/* ------------------------------------------------------------------------ */

/* Record-level failure kinds; records.py maps them to reasons. */
enum {
    E_MISSING_RECORD = 1,   /* fewer records than the batch declares */
    E_RECORD_LENGTH = 2,    /* record length negative or past the end of the batch */
    E_VARINT = 3,           /* varint longer than Kafka allows */
    E_OVERRUN = 4,          /* a field runs past the record's length */
    E_OFFSET_DELTA = 5,     /* offset delta not increasing or past last_offset_delta */
    E_HEADER_COUNT = 6,     /* negative header count */
    E_HEADER_KEY = 7,       /* negative header key length */
    E_RECORD_SIZE = 8,      /* fields end before the record's declared length */
    E_TRAILING = 9,         /* bytes after the last declared record */
    E_NO_MEMORY = 100,
};

typedef struct {
    int64_t entry;   /* index into the scan table */
    int32_t kind;
    int32_t record;  /* index of the failing record in its batch */
} failure_t;

typedef struct {
    /* one slot per row; sized up front from a bound on the row count */
    int64_t *offset;
    int64_t *timestamp;
    int8_t *timestamp_type;
    int32_t *key_offsets;
    int32_t *value_offsets;
    int32_t *header_offsets;
    uint8_t *key_valid;
    uint8_t *value_valid;
    /* growable */
    gbuf key_data, value_data, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid;
    gbuf rows_offset, rows_timestamp, rows_ts_type, rows_key_offsets, rows_value_offsets,
        rows_header_offsets, rows_key_valid, rows_value_valid, rows_partition, rows_topic;
    int64_t rows;
    int64_t headers;
    int64_t key_nulls, value_nulls, hvalue_nulls;
    int bad_utf8;
} builder_t;

typedef struct {
    const uint8_t *data;
    size_t len;
    const entry_t *entry;
    int64_t entry_index;
} segment_t;

static inline void set_bit(uint8_t *bits, int64_t i, int on)
{
    if (on)
        bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    else
        bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
}

#define FAIL(k)    \
    do {           \
        kind = (k); \
        goto fail; \
    } while (0)

#define VARINT_FAIL(rc) FAIL((rc) == VARINT_TOO_LONG ? E_VARINT : E_OVERRUN)

/* Decodes one batch's records into the builder. On failure the builder is
 * rolled back to its state before the batch and the kind is returned. */
static int decode_segment(builder_t *b, const segment_t *seg, int64_t min_offset,
                          int32_t *failed_record)
{
    const entry_t *e = seg->entry;
    const uint8_t *p = seg->data, *end = seg->data + seg->len;
    const int log_append = (e->attributes & 8) != 0;
    const int32_t last_delta =
        (int32_t)(uint32_t)((uint64_t)e->last_offset - (uint64_t)e->base_offset);
    const int64_t rows0 = b->rows, headers0 = b->headers;
    const size_t key0 = b->key_data.len, value0 = b->value_data.len;
    const size_t hkey0 = b->hkey_data.len, hvalue0 = b->hvalue_data.len;
    const int64_t key_nulls0 = b->key_nulls, value_nulls0 = b->value_nulls,
                  hvalue_nulls0 = b->hvalue_nulls;
    int32_t prev_delta = -1;
    int32_t r = 0;
    int kind = 0;
    int rc;

    for (r = 0; r < e->record_count; r++) {
        int32_t length, offset_delta, key_len, value_len, header_count;
        int64_t ts_delta;
        if (p >= end)
            FAIL(E_MISSING_RECORD);
        rc = read_varint(&p, end, &length);
        if (rc)
            FAIL(rc == VARINT_TOO_LONG ? E_VARINT : E_RECORD_LENGTH);
        if (length < 0 || (size_t)length > (size_t)(end - p))
            FAIL(E_RECORD_LENGTH);
        const uint8_t *rend = p + length;
        if (p >= rend)
            FAIL(E_OVERRUN);
        p++; /* record attributes: unused */
        if ((rc = read_varlong(&p, rend, &ts_delta)))
            VARINT_FAIL(rc);
        if ((rc = read_varint(&p, rend, &offset_delta)))
            VARINT_FAIL(rc);
        if (offset_delta <= prev_delta || offset_delta > last_delta)
            FAIL(E_OFFSET_DELTA);
        prev_delta = offset_delta;
        if ((rc = read_varint(&p, rend, &key_len)))
            VARINT_FAIL(rc);
        const uint8_t *key = p;
        if (key_len >= 0) {
            if ((size_t)key_len > (size_t)(rend - p))
                FAIL(E_OVERRUN);
            p += key_len;
        }
        if ((rc = read_varint(&p, rend, &value_len)))
            VARINT_FAIL(rc);
        const uint8_t *value = p;
        if (value_len >= 0) {
            if ((size_t)value_len > (size_t)(rend - p))
                FAIL(E_OVERRUN);
            p += value_len;
        }
        if ((rc = read_varint(&p, rend, &header_count)))
            VARINT_FAIL(rc);
        if (header_count < 0)
            FAIL(E_HEADER_COUNT);

        const int64_t offset = (int64_t)((uint64_t)e->base_offset + (uint64_t)(int64_t)offset_delta);
        const int emit = offset >= min_offset;
        const int64_t n = b->rows;
        if (emit) {
            b->offset[n] = offset;
            b->timestamp[n] =
                log_append ? e->max_timestamp
                           : (int64_t)((uint64_t)e->base_timestamp + (uint64_t)ts_delta);
            b->timestamp_type[n] = (int8_t)log_append;
            if (key_len >= 0) {
                if (!gbuf_reserve(&b->key_data, (size_t)key_len, 0))
                    FAIL(E_NO_MEMORY);
                memcpy(b->key_data.data + b->key_data.len, key, (size_t)key_len);
                b->key_data.len += (size_t)key_len;
                set_bit(b->key_valid, n, 1);
            } else {
                set_bit(b->key_valid, n, 0);
                b->key_nulls++;
            }
            b->key_offsets[n + 1] = (int32_t)b->key_data.len;
            if (value_len >= 0) {
                if (!gbuf_reserve(&b->value_data, (size_t)value_len, 0))
                    FAIL(E_NO_MEMORY);
                memcpy(b->value_data.data + b->value_data.len, value, (size_t)value_len);
                b->value_data.len += (size_t)value_len;
                set_bit(b->value_valid, n, 1);
            } else {
                set_bit(b->value_valid, n, 0);
                b->value_nulls++;
            }
            b->value_offsets[n + 1] = (int32_t)b->value_data.len;
        }
        for (int32_t h = 0; h < header_count; h++) {
            int32_t hkey_len, hvalue_len;
            if ((rc = read_varint(&p, rend, &hkey_len)))
                VARINT_FAIL(rc);
            if (hkey_len < 0)
                FAIL(E_HEADER_KEY);
            if ((size_t)hkey_len > (size_t)(rend - p))
                FAIL(E_OVERRUN);
            const uint8_t *hkey = p;
            p += hkey_len;
            if ((rc = read_varint(&p, rend, &hvalue_len)))
                VARINT_FAIL(rc);
            const uint8_t *hvalue = p;
            if (hvalue_len >= 0) {
                if ((size_t)hvalue_len > (size_t)(rend - p))
                    FAIL(E_OVERRUN);
                p += hvalue_len;
            }
            if (!emit)
                continue;
            const int64_t hn = b->headers;
            if (!gbuf_reserve(&b->hkey_data, (size_t)hkey_len, 0) ||
                !gbuf_reserve(&b->hkey_offsets, sizeof(int32_t), 0) ||
                !gbuf_reserve(&b->hvalue_offsets, sizeof(int32_t), 0))
                FAIL(E_NO_MEMORY);
            /* the bitmap's len is unused: its size follows from the header count */
            if ((size_t)(hn >> 3) + 1 > b->hvalue_valid.cap &&
                !gbuf_grow(&b->hvalue_valid, (size_t)(hn >> 3) + 1, 1))
                FAIL(E_NO_MEMORY);
            if (!b->bad_utf8 && !utf8_valid(hkey, (size_t)hkey_len))
                b->bad_utf8 = 1;
            memcpy(b->hkey_data.data + b->hkey_data.len, hkey, (size_t)hkey_len);
            b->hkey_data.len += (size_t)hkey_len;
            if (hvalue_len >= 0) {
                if (!gbuf_reserve(&b->hvalue_data, (size_t)hvalue_len, 0))
                    FAIL(E_NO_MEMORY);
                memcpy(b->hvalue_data.data + b->hvalue_data.len, hvalue, (size_t)hvalue_len);
                b->hvalue_data.len += (size_t)hvalue_len;
                set_bit((uint8_t *)b->hvalue_valid.data, hn, 1);
            } else {
                set_bit((uint8_t *)b->hvalue_valid.data, hn, 0);
                b->hvalue_nulls++;
            }
            b->headers = hn + 1;
            /* offsets arrays hold headers+1 entries; slot 0 was written at init */
            ((int32_t *)b->hkey_offsets.data)[hn + 1] = (int32_t)b->hkey_data.len;
            ((int32_t *)b->hvalue_offsets.data)[hn + 1] = (int32_t)b->hvalue_data.len;
            b->hkey_offsets.len += sizeof(int32_t);
            b->hvalue_offsets.len += sizeof(int32_t);
        }
        if (p != rend)
            FAIL(E_RECORD_SIZE);
        if (emit) {
            b->header_offsets[n + 1] = (int32_t)b->headers;
            b->rows = n + 1;
        }
    }
    if (p != end)
        FAIL(E_TRAILING);
    return 0;

fail:
    *failed_record = r;
    b->rows = rows0;
    b->headers = headers0;
    b->key_data.len = key0;
    b->value_data.len = value0;
    b->hkey_data.len = hkey0;
    b->hvalue_data.len = hvalue0;
    b->hkey_offsets.len = (size_t)(headers0 + 1) * sizeof(int32_t);
    b->hvalue_offsets.len = (size_t)(headers0 + 1) * sizeof(int32_t);
    b->key_nulls = key_nulls0;
    b->value_nulls = value_nulls0;
    b->hvalue_nulls = hvalue_nulls0;
    return kind;
}

#undef FAIL
#undef VARINT_FAIL

static void builder_free(builder_t *b)
{
    gbuf *all[] = {&b->key_data,          &b->value_data,         &b->hkey_offsets,
                   &b->hkey_data,         &b->hvalue_offsets,     &b->hvalue_data,
                   &b->hvalue_valid,      &b->rows_offset,        &b->rows_timestamp,
                   &b->rows_ts_type,      &b->rows_key_offsets,   &b->rows_value_offsets,
                   &b->rows_header_offsets, &b->rows_key_valid,   &b->rows_value_valid,
                   &b->rows_partition,    &b->rows_topic};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gbuf_free(all[i]);
}

static int builder_init(builder_t *b, size_t max_rows, size_t data_bytes)
{
    memset(b, 0, sizeof *b);
    size_t bitmap = max_rows / 8 + 1;
    size_t small = data_bytes < 65536 ? data_bytes : 65536;
    int ok = gbuf_init(&b->rows_offset, max_rows * 8, 0) &&
             gbuf_init(&b->rows_timestamp, max_rows * 8, 0) &&
             gbuf_init(&b->rows_ts_type, max_rows, 0) &&
             gbuf_init(&b->rows_key_offsets, (max_rows + 1) * 4, 0) &&
             gbuf_init(&b->rows_value_offsets, (max_rows + 1) * 4, 0) &&
             gbuf_init(&b->rows_header_offsets, (max_rows + 1) * 4, 0) &&
             gbuf_init(&b->rows_key_valid, bitmap, 1) &&
             gbuf_init(&b->rows_value_valid, bitmap, 1) &&
             gbuf_init(&b->rows_partition, max_rows * 4, 0) &&
             gbuf_init(&b->rows_topic, max_rows * 4, 0) &&
             /* values are bounded by the input size, so that buffer never grows */
             gbuf_init(&b->value_data, data_bytes, 0) && gbuf_init(&b->key_data, small, 0) &&
             gbuf_init(&b->hkey_data, small / 4, 0) && gbuf_init(&b->hvalue_data, small / 4, 0) &&
             gbuf_init(&b->hkey_offsets, 4096, 0) && gbuf_init(&b->hvalue_offsets, 4096, 0) &&
             gbuf_init(&b->hvalue_valid, 128, 1);
    if (!ok) {
        builder_free(b);
        return 0;
    }
    b->offset = (int64_t *)b->rows_offset.data;
    b->timestamp = (int64_t *)b->rows_timestamp.data;
    b->timestamp_type = (int8_t *)b->rows_ts_type.data;
    b->key_offsets = (int32_t *)b->rows_key_offsets.data;
    b->value_offsets = (int32_t *)b->rows_value_offsets.data;
    b->header_offsets = (int32_t *)b->rows_header_offsets.data;
    b->key_valid = (uint8_t *)b->rows_key_valid.data;
    b->value_valid = (uint8_t *)b->rows_value_valid.data;
    b->key_offsets[0] = b->value_offsets[0] = b->header_offsets[0] = 0;
    ((int32_t *)b->hkey_offsets.data)[0] = 0;
    ((int32_t *)b->hvalue_offsets.data)[0] = 0;
    b->hkey_offsets.len = b->hvalue_offsets.len = sizeof(int32_t);
    return 1;
}

#define MIN_RECORD_BYTES 7  /* length, attributes, 3 varints and the header count */

/*
 * decode(buf, table, indices, payloads, min_offset, partition)
 *   buf       the fetch's records bytes
 *   table     the table from scan()
 *   indices   int64 buffer: the table entries to decode, in order; None: all
 *   payloads  None (every batch's records lie in buf), or a list with one
 *             item per index: None, or the decompressed records of that batch
 *   min_offset  records below it are checked but not emitted
 *   partition   fills the partition column (the topic column's indices are 0)
 */
static PyObject *py_decode(PyObject *self, PyObject *args)
{
    Py_buffer buf, table, indices = {0};
    PyObject *indices_obj, *payloads;
    long long min_offset;
    int partition;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*OOLi:decode", &buf, &table, &indices_obj, &payloads,
                          &min_offset, &partition))
        return NULL;

    PyObject *result = NULL;
    segment_t *segs = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t n_views = 0;
    failure_t *failures = NULL;
    Py_ssize_t n_failures = 0;
    builder_t b;
    int built = 0;
    Py_ssize_t n_entries = table.len / (Py_ssize_t)sizeof(entry_t);
    Py_ssize_t count = 0;
    int all_entries = indices_obj == Py_None;
    if (all_entries) {
        const entry_t *last = n_entries ? (const entry_t *)table.buf + n_entries - 1 : NULL;
        count = n_entries;
        if (last && (last->status == ST_BROKEN_FRAMING || last->status == ST_INCOMPLETE))
            count--;
        if (payloads != Py_None) {
            PyErr_SetString(PyExc_ValueError, "decode: payloads need indices");
            goto done;
        }
    } else {
        if (PyObject_GetBuffer(indices_obj, &indices, PyBUF_SIMPLE) < 0)
            goto done;
        count = indices.len / (Py_ssize_t)sizeof(int64_t);
        if (payloads != Py_None &&
            (!PyList_Check(payloads) || PyList_GET_SIZE(payloads) != count)) {
            PyErr_SetString(PyExc_ValueError, "decode: payloads must be a list, one per index");
            goto done;
        }
    }

    if (indices.len % (Py_ssize_t)sizeof(int64_t) || table.len % (Py_ssize_t)sizeof(entry_t)) {
        PyErr_SetString(PyExc_ValueError, "decode: table or indices of the wrong size");
        goto done;
    }
    segs = calloc((size_t)count + 1, sizeof *segs);
    views = calloc((size_t)count + 1, sizeof *views);
    failures = calloc((size_t)count + 1, sizeof *failures);
    if (!segs || !views || !failures) {
        PyErr_NoMemory();
        goto done;
    }

    const entry_t *entries = (const entry_t *)table.buf;
    size_t max_rows = 0, data_bytes = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t idx = i;
        if (!all_entries)
            memcpy(&idx, (const char *)indices.buf + i * 8, 8);
        if (idx < 0 || idx >= n_entries) {
            PyErr_SetString(PyExc_ValueError, "decode: entry index out of range");
            goto done;
        }
        const entry_t *e = &entries[idx];
        PyObject *payload = payloads == Py_None ? Py_None : PyList_GET_ITEM(payloads, i);
        segs[i].entry = e;
        segs[i].entry_index = idx;
        if (e->status != ST_OK) {
            PyErr_SetString(PyExc_ValueError, "decode: entry is not a valid batch");
            goto done;
        }
        if (payload == Py_None) {
            if ((e->attributes & 7) != 0 || e->start < 0 || e->size < V2_HEADER ||
                (uint64_t)e->start + (uint64_t)e->size > (uint64_t)buf.len) {
                PyErr_SetString(PyExc_ValueError, "decode: entry is not a whole uncompressed batch in buf");
                goto done;
            }
            segs[i].data = (const uint8_t *)buf.buf + e->start + V2_HEADER;
            segs[i].len = (size_t)(e->size - V2_HEADER);
        } else {
            if (PyObject_GetBuffer(payload, &views[n_views], PyBUF_SIMPLE) < 0)
                goto done;
            segs[i].data = views[n_views].buf;
            segs[i].len = (size_t)views[n_views].len;
            n_views++;
        }
        size_t bound = segs[i].len / MIN_RECORD_BYTES;
        max_rows += (size_t)e->record_count < bound ? (size_t)e->record_count : bound;
        data_bytes += segs[i].len;
    }
    /* Arrow binary offsets are int32: every data buffer must stay below 2 GiB. */
    if (data_bytes > (size_t)INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError,
                        "decoded records exceed 2 GiB in one call; fetch fewer bytes");
        goto done;
    }
    if (!builder_init(&b, max_rows, data_bytes)) {
        PyErr_NoMemory();
        goto done;
    }
    built = 1;

    int out_of_memory = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t record = 0;
        int kind = decode_segment(&b, &segs[i], (int64_t)min_offset, &record);
        if (kind == E_NO_MEMORY) {
            out_of_memory = 1;
            break;
        }
        if (kind) {
            failures[n_failures].entry = segs[i].entry_index;
            failures[n_failures].kind = kind;
            failures[n_failures].record = record;
            n_failures++;
        }
    }
    Py_END_ALLOW_THREADS
    if (out_of_memory) {
        PyErr_NoMemory();
        goto done;
    }

    PyObject *failure_list = PyList_New(n_failures);
    if (!failure_list)
        goto done;
    for (Py_ssize_t i = 0; i < n_failures; i++) {
        PyObject *item = Py_BuildValue("(Lii)", (long long)failures[i].entry, failures[i].kind,
                                       failures[i].record);
        if (!item) {
            Py_DECREF(failure_list);
            goto done;
        }
        PyList_SET_ITEM(failure_list, i, item);
    }

    const size_t rows = (size_t)b.rows, headers = (size_t)b.headers;
    /* constant columns: every row has the same partition and dictionary index 0 */
    memset(b.rows_topic.data, 0, rows * 4);
    for (size_t i = 0; i < rows; i++)
        ((int32_t *)b.rows_partition.data)[i] = partition;
    PyObject *parts[17];
    parts[0] = gbuf_release(&b.rows_offset, rows * 8);
    parts[1] = gbuf_release(&b.rows_timestamp, rows * 8);
    parts[2] = gbuf_release(&b.rows_ts_type, rows);
    parts[3] = gbuf_release(&b.rows_key_valid, (rows + 7) / 8);
    parts[4] = gbuf_release(&b.rows_key_offsets, (rows + 1) * 4);
    parts[5] = gbuf_release(&b.key_data, b.key_data.len);
    parts[6] = gbuf_release(&b.rows_value_valid, (rows + 7) / 8);
    parts[7] = gbuf_release(&b.rows_value_offsets, (rows + 1) * 4);
    parts[8] = gbuf_release(&b.value_data, b.value_data.len);
    parts[9] = gbuf_release(&b.rows_header_offsets, (rows + 1) * 4);
    parts[10] = gbuf_release(&b.hkey_offsets, (headers + 1) * 4);
    parts[11] = gbuf_release(&b.hkey_data, b.hkey_data.len);
    parts[12] = gbuf_release(&b.hvalue_valid, (headers + 7) / 8);
    parts[13] = gbuf_release(&b.hvalue_offsets, (headers + 1) * 4);
    parts[14] = gbuf_release(&b.hvalue_data, b.hvalue_data.len);
    parts[15] = gbuf_release(&b.rows_partition, rows * 4);
    parts[16] = gbuf_release(&b.rows_topic, rows * 4);
    int parts_ok = 1;
    for (int i = 0; i < 17; i++)
        parts_ok &= parts[i] != NULL;
    if (parts_ok) {
        result = Py_BuildValue(
            "{s:L,s:L,s:N,s:N,s:N,s:N,s:L,s:N,s:N,s:N,s:L,s:N,s:N,s:N,s:N,s:N,s:N,s:L,s:N,s:N,"
            "s:O,s:N,s:N,s:N}",
            "rows", (long long)b.rows, "headers", (long long)b.headers, "offset", parts[0],
            "timestamp", parts[1], "timestamp_type", parts[2], "key_valid", parts[3],
            "key_nulls", (long long)b.key_nulls, "key_offsets", parts[4], "key_data", parts[5],
            "value_valid", parts[6], "value_nulls", (long long)b.value_nulls, "value_offsets",
            parts[7], "value_data", parts[8], "header_offsets", parts[9], "hkey_offsets",
            parts[10], "hkey_data", parts[11], "hvalue_valid", parts[12], "hvalue_nulls",
            (long long)b.hvalue_nulls, "hvalue_offsets", parts[13], "hvalue_data", parts[14],
            "bad_utf8", b.bad_utf8 ? Py_True : Py_False, "failures", failure_list, "partition",
            parts[15], "topic_index", parts[16]);
        /* "N" steals references even when building fails part-way */
    } else {
        for (int i = 0; i < 17; i++)
            Py_XDECREF(parts[i]);
        Py_DECREF(failure_list);
    }

done:
    if (built)
        builder_free(&b);
    for (Py_ssize_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    free(views);
    free(segs);
    free(failures);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&table);
    if (indices.obj)
        PyBuffer_Release(&indices);
    return result;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int crc = 0;
    int hardware = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*|Ip:crc32c", &view, &crc, &hardware))
        return NULL;
    uint32_t out;
    Py_BEGIN_ALLOW_THREADS
    out = crc32c_update(crc, view.buf, (size_t)view.len, hardware);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

static PyObject *py_utf8_valid(PyObject *self, PyObject *args)
{
    Py_buffer view;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:utf8_valid", &view))
        return NULL;
    int ok = utf8_valid(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyObject *py_set_buffer_cache(PyObject *self, PyObject *args)
{
    Py_ssize_t limit;
    (void)self;
    if (!PyArg_ParseTuple(args, "n:set_buffer_cache", &limit))
        return NULL;
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "set_buffer_cache: negative limit");
        return NULL;
    }
    size_t previous = cache_limit;
    cache_limit = (size_t)limit;
    cache_clear();
    return PyLong_FromSize_t(previous);
}

static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS,
     "scan(buf, check_crc) -> (table, summary): one 80-byte entry per batch framing unit."},
    {"decode", py_decode, METH_VARARGS,
     "decode(buf, table, indices, payloads, min_offset, partition) -> dict of Arrow buffers."},
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(data, crc=0, hardware=True) -> int: CRC32C of data, continuing from crc."},
    {"set_buffer_cache", py_set_buffer_cache, METH_VARARGS,
     "set_buffer_cache(limit_bytes) -> previous limit: bytes of freed output kept for reuse."},
    {"utf8_valid", py_utf8_valid, METH_VARARGS, "utf8_valid(data) -> bool (strict UTF-8)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_records",
    .m_doc = "Kafka RecordBatch v2 decoding kernel.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__records(void)
{
    crc_init();
    if (PyType_Ready(&OwnedBufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ENTRY_SIZE", (long)sizeof(entry_t)) < 0 ||
        PyModule_AddIntConstant(m, "HARDWARE_CRC", crc_use_hw) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&OwnedBufferType);
    if (PyModule_AddObject(m, "OwnedBuffer", (PyObject *)&OwnedBufferType) < 0) {
        Py_DECREF(&OwnedBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
