/* Native line classifier for the log scanner (core/diagnose/scan.py).
 *
 * Python's bytes.find runs at memory speed but once per literal; the scanner has ~80 literals,
 * so a pure-Python pass over a big log reads it 80 times. This module reads it once: a matcher
 * built from the literals (two-byte prefix bitmap + memcmp) walks each line, counts the lines
 * that change nothing but NCCL counters, and stops at the first line Python must read itself.
 * It decides nothing about meaning: every rule stays in Python, and scan.py's pure-Python path
 * is the reference this one is tested against (tests/test_ingest_speed_logic.py).
 *
 *   matcher(report_tokens, fact_tokens) -> capsule
 *   classify(matcher, buf, pos, end) -> (stop, lines, heads, transports, facts, hint, other)
 *
 * classify looks at the complete lines of buf[pos:end] (end just after a newline) and returns
 *   stop        offset of the first line Python must read (end when there is none)
 *   lines       lines before stop
 *   heads       of them, plain `host:pid:tid [dev] NCCL INFO ` lines
 *   transports  {name: count} of their `Channel a/b : s[x] -> d[y] via T` lines (T as
 *               parse_nccl names it: NET/IB/0 -> IB, P2P/CUMEM -> P2P)
 *   facts       NCCL INFO lines holding a fact token (version, interface, comm, ...), as bytes,
 *               for Python to parse
 *   hint        start of the last line with a `:dd:dd` time hint, or -1
 *   other       1 if a line that is not an NCCL INFO line was passed over
 *
 *   dict_records(buf, pos, end, max_steps, bar_step)
 *       -> (stop, n, steps, values, present, ints, order, ascending, max_steps, bar_step)
 *   rows(steps, values, present, ints, order, rank, start, stop) -> [record dict, ...]
 *
 * dict_records is MetricsParser's (core/ingest/metrics.py) reading of console metric lines,
 * `[tqdm bar \r]... {'loss': '1.2', ...} [\r tqdm bar]...`, one record per line as a row of
 * columns (bytes); rows() turns rows into the dicts the Python path makes, with the same keys,
 * values, types and key order. dict_records stops at the first line that is anything else or
 * anything unusual (escapes, nested values, a dict without a step, an event-stream record,
 * ...): Python reads that one and calls again.
 *
 * A line is Python's in classify when it holds a report token, a byte >= 0x80, a line-leading '{', or
 * `NCCL INFO` anywhere but in the plain head shape, or a fact token outside an NCCL INFO line,
 * or a `via` that is not in the channel shape.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <string.h>

#define STRIDE 3
#define MIN_TOKEN (STRIDE + 1)

enum { K_REPORT = 0, K_FACT = 1, K_NCCL_INFO = 2, K_VIA = 3 };

typedef struct {
    /* A token of length >= MIN_TOKEN covers a position j = 0 (mod STRIDE) of the line with
     * its bytes k, k+1 for some k < STRIDE: the scan reads one byte pair every STRIDE bytes
     * and looks the pair up; bit k of pairflags says "a token has this pair at offset k". */
    unsigned char pairflags[65536];
    int32_t first[STRIDE][65536];  /* first token with that pair at offset k, or -1 */
    int32_t *next[STRIDE];
    unsigned char single[8];       /* one-byte report tokens */
    int nsingle;
    uint32_t *head4;               /* each token's first four bytes, compared before memcmp */
    Py_ssize_t ntok;
    char **tok;
    Py_ssize_t *len;
    unsigned char *kind;
} Matcher;

static void matcher_free(PyObject *cap) {
    Matcher *m = PyCapsule_GetPointer(cap, "tunedeck.matcher");
    if (!m) return;
    for (Py_ssize_t i = 0; i < m->ntok; i++) PyMem_Free(m->tok[i]);
    PyMem_Free(m->tok);
    PyMem_Free(m->len);
    PyMem_Free(m->kind);
    PyMem_Free(m->head4);
    for (int k = 0; k < STRIDE; k++) PyMem_Free(m->next[k]);
    PyMem_Free(m);
}

static int add_token(Matcher *m, const char *s, Py_ssize_t n, unsigned char kind) {
    if (n == 1) {
        if (kind != K_REPORT) {
            PyErr_SetString(PyExc_ValueError, "one-byte tokens can only be report tokens");
            return -1;
        }
        if (m->nsingle == (int)sizeof m->single) {
            PyErr_SetString(PyExc_ValueError, "too many one-byte tokens");
            return -1;
        }
        m->single[m->nsingle++] = (unsigned char)s[0];
        return 0;
    }
    if (n < MIN_TOKEN) {
        PyErr_Format(PyExc_ValueError, "tokens need one byte or at least %d", MIN_TOKEN);
        return -1;
    }
    Py_ssize_t i = m->ntok++;
    m->tok[i] = PyMem_Malloc(n);
    if (!m->tok[i]) { PyErr_NoMemory(); return -1; }
    memcpy(m->tok[i], s, n);
    memcpy(&m->head4[i], s, 4);
    m->len[i] = n;
    m->kind[i] = kind;
    for (int k = 0; k < STRIDE; k++) {
        unsigned p = ((unsigned char)s[k] << 8) | (unsigned char)s[k + 1];
        m->pairflags[p] |= 1 << k;
        m->next[k][i] = m->first[k][p];
        m->first[k][p] = (int32_t)i;
    }
    return 0;
}

static int add_list(Matcher *m, PyObject *seq, unsigned char kind) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        char *s;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(o, &s, &len) < 0) return -1;
        if (len < 1) {
            PyErr_SetString(PyExc_ValueError, "empty token");
            return -1;
        }
        if (add_token(m, s, len, kind) < 0) return -1;
    }
    return 0;
}

static PyObject *py_matcher(PyObject *self, PyObject *args) {
    PyObject *rep, *fact;
    if (!PyArg_ParseTuple(args, "OO", &rep, &fact)) return NULL;
    PyObject *rs = PySequence_Fast(rep, "report tokens must be a sequence of bytes");
    if (!rs) return NULL;
    PyObject *fs = PySequence_Fast(fact, "fact tokens must be a sequence of bytes");
    if (!fs) { Py_DECREF(rs); return NULL; }
    Py_ssize_t cap = PySequence_Fast_GET_SIZE(rs) + PySequence_Fast_GET_SIZE(fs) + 2;
    Matcher *m = PyMem_Calloc(1, sizeof(Matcher));
    PyObject *res = NULL;
    if (!m) { PyErr_NoMemory(); goto done; }
    memset(m->first, 0xff, sizeof m->first);
    m->tok = PyMem_Calloc(cap, sizeof(char *));
    m->len = PyMem_Calloc(cap, sizeof(Py_ssize_t));
    m->kind = PyMem_Calloc(cap, 1);
    m->head4 = PyMem_Calloc(cap, sizeof(uint32_t));
    for (int k = 0; k < STRIDE; k++) m->next[k] = PyMem_Calloc(cap, sizeof(int32_t));
    if (!m->tok || !m->len || !m->kind || !m->head4 || !m->next[0] || !m->next[1] || !m->next[2]) {
        PyErr_NoMemory();
        goto fail;
    }
    if (add_list(m, rs, K_REPORT) < 0 || add_list(m, fs, K_FACT) < 0) goto fail;
    if (add_token(m, "NCCL INFO", 9, K_NCCL_INFO) < 0) goto fail;
    if (add_token(m, " via ", 5, K_VIA) < 0) goto fail;
    res = PyCapsule_New(m, "tunedeck.matcher", matcher_free);
    if (res) goto done;
fail:
    if (m) {
        PyObject *tmp = PyCapsule_New(m, "tunedeck.matcher", matcher_free);
        Py_XDECREF(tmp);   /* frees m */
    }
done:
    Py_DECREF(rs);
    Py_DECREF(fs);
    return res;
}

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline int is_word(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static inline int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* digits+ at *p, advancing; 0 when there are none */
static inline int digits(const unsigned char **p, const unsigned char *e) {
    const unsigned char *s = *p;
    while (*p < e && is_digit(**p)) (*p)++;
    return *p > s;
}

/* an optional '-' and at most 18 digits, checked by the caller */
static inline long long small_int(const unsigned char *p, const unsigned char *e) {
    int neg = p < e && *p == '-';
    long long x = 0;
    for (p += neg; p < e; p++) x = x * 10 + (*p - '0');
    return neg ? -x : x;
}

static inline int lit(const unsigned char **p, const unsigned char *e, const char *s, size_t n) {
    if ((size_t)(e - *p) < n || memcmp(*p, s, n) != 0) return 0;
    *p += n;
    return 1;
}

/* `^[^\s:\[\]]+:\d+:\d+ \[\d+\] NCCL INFO `; returns the message start or NULL */
static const unsigned char *nccl_head(const unsigned char *p, const unsigned char *e) {
    const unsigned char *s = p;
    while (p < e && !is_space(*p) && *p != ':' && *p != '[' && *p != ']') p++;
    if (p == s || !lit(&p, e, ":", 1) || !digits(&p, e) || !lit(&p, e, ":", 1) ||
        !digits(&p, e) || !lit(&p, e, " [", 2) || !digits(&p, e) ||
        !lit(&p, e, "] NCCL INFO ", 12))
        return NULL;
    return p;
}

/* `\d+\[[\w.]+\]` */
static int rank_dev(const unsigned char **p, const unsigned char *e) {
    if (!digits(p, e) || !lit(p, e, "[", 1)) return 0;
    const unsigned char *s = *p;
    while (*p < e && (is_word(**p) || **p == '.')) (*p)++;
    return *p > s && lit(p, e, "]", 1);
}

/* `Channel \d+/\d+ : \d+\[[\w.]+\] -> \d+\[[\w.]+\](?: \[\w+\])? via (\S+)` at the message
 * start; sets the transport span. */
static int via_shape(const unsigned char *p, const unsigned char *e,
                     const unsigned char **t, const unsigned char **te) {
    if (!lit(&p, e, "Channel ", 8) || !digits(&p, e) || !lit(&p, e, "/", 1) ||
        !digits(&p, e) || !lit(&p, e, " : ", 3) || !rank_dev(&p, e) ||
        !lit(&p, e, " -> ", 4) || !rank_dev(&p, e))
        return 0;
    const unsigned char *q = p;
    if (lit(&q, e, " [", 2)) {
        const unsigned char *s = q;
        while (q < e && is_word(*q)) q++;
        if (q > s && lit(&q, e, "]", 1)) p = q;
    }
    if (!lit(&p, e, " via ", 5)) return 0;
    const unsigned char *s = p;
    while (p < e && !is_space(*p)) p++;
    if (p == s) return 0;
    *t = s;
    *te = p;
    return 1;
}

/* `:\d\d:\d\d` anywhere in the line */
static int time_hint(const unsigned char *p, const unsigned char *e) {
    while ((p = memchr(p, ':', e - p)) != NULL) {
        if (e - p >= 6 && is_digit(p[1]) && is_digit(p[2]) && p[3] == ':' && is_digit(p[4]) &&
            is_digit(p[5]))
            return 1;
        p++;
    }
    return 0;
}

/* transport names counted in C, turned into a dict once per call */
#define MAX_NAMES 32
#define NAME_LEN 32
typedef struct {
    int n;
    Py_ssize_t len[MAX_NAMES];
    char name[MAX_NAMES][NAME_LEN];
    Py_ssize_t count[MAX_NAMES];
} Names;

/* parse_nccl's transport_name: NET/<x>/... -> x, else the part before the first '/'.
 * Returns 0, or -1 when the name does not fit (the caller hands the line to Python). */
static int count_transport(Names *t, const unsigned char *a, const unsigned char *te) {
    const unsigned char *b = memchr(a, '/', te - a);
    if (!b) b = te;
    if (b - a == 3 && memcmp(a, "NET", 3) == 0 && b < te) {
        a = b + 1;
        b = memchr(a, '/', te - a);
        if (!b) b = te;
    }
    Py_ssize_t n = b - a;
    for (int i = 0; i < t->n; i++)
        if (t->len[i] == n && memcmp(t->name[i], a, n) == 0) {
            t->count[i]++;
            return 0;
        }
    if (t->n == MAX_NAMES || n > NAME_LEN) return -1;
    memcpy(t->name[t->n], a, n);
    t->len[t->n] = n;
    t->count[t->n++] = 1;
    return 0;
}

static PyObject *names_dict(const Names *t) {
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < t->n; i++) {
        PyObject *k = PyUnicode_DecodeASCII(t->name[i], t->len[i], NULL);
        PyObject *v = PyLong_FromSsize_t(t->count[i]);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0) Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *py_classify(PyObject *self, PyObject *args) {
    PyObject *cap;
    Py_buffer view;
    Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "Oy*nn", &cap, &view, &pos, &end)) return NULL;
    Matcher *m = PyCapsule_GetPointer(cap, "tunedeck.matcher");
    if (!m) { PyBuffer_Release(&view); return NULL; }
    if (pos < 0 || end > view.len || pos > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pos/end outside the buffer");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    PyObject *transports = NULL, *facts = PyList_New(0);
    Names names = {0};
    if (!facts) goto error;
    Py_ssize_t lines = 0, heads = 0, hint = -1;
    int other = 0;
    const unsigned char *p = buf + pos, *e = buf + end;
    while (p < e) {
        const unsigned char *nl = memchr(p, '\n', e - p);
        if (!nl) break;   /* no complete line left: the caller's business */
        int report = (*p == '{'), fact = 0, info = 0, via = 0;
        unsigned char any = 0;
        for (const unsigned char *q = p; q < nl; q++) any |= *q;   /* vectorised */
        if (any & 0x80) report = 1;                                 /* non-ASCII */
        for (int k = 0; k < m->nsingle && !report; k++)
            if (memchr(p, m->single[k], nl - p)) report = 1;
        for (const unsigned char *q = p; q + 1 < nl && !report; q += STRIDE) {
            unsigned pr = (q[0] << 8) | q[1];
            unsigned f = m->pairflags[pr];
            if (!f) continue;
            for (int k = 0; k < STRIDE; k++) {
                if (!(f >> k & 1) || q - p < k) continue;
                const unsigned char *s0 = q - k;
                for (int32_t i = m->first[k][pr]; i >= 0; i = m->next[k][i]) {
                    Py_ssize_t n = m->len[i];
                    uint32_t h;
                    if (nl - s0 < n) continue;
                    memcpy(&h, s0, 4);
                    if (h != m->head4[i] || memcmp(s0 + 4, m->tok[i] + 4, n - 4) != 0) continue;
                    switch (m->kind[i]) {
                    case K_REPORT: report = 1; break;
                    case K_FACT: fact = 1; break;
                    case K_NCCL_INFO: info = 1; break;
                    default: via++;
                    }
                }
            }
        }
        if (report) break;
        const unsigned char *msg = info ? nccl_head(p, nl) : NULL;
        if (info && !msg) break;       /* NCCL INFO not in the plain head shape */
        if (msg) {
            if (via) {
                const unsigned char *t, *te;
                if (via != 1 || !via_shape(msg, nl, &t, &te)) break;
                if (count_transport(&names, t, te) < 0) break;
            } else if (fact) {
                PyObject *b = PyBytes_FromStringAndSize((const char *)p, nl - p);
                if (!b || PyList_Append(facts, b) < 0) { Py_XDECREF(b); goto error; }
                Py_DECREF(b);
            }
            heads++;
        } else {
            if (fact) break;
            other = 1;
        }
        if (time_hint(p, nl)) hint = p - buf;
        lines++;
        p = nl + 1;
    }
    PyBuffer_Release(&view);
    if (!(transports = names_dict(&names))) goto error_released;
    return Py_BuildValue("nnnNNni", (Py_ssize_t)(p - buf), lines, heads, transports, facts,
                         hint, other);
error:
    PyBuffer_Release(&view);
error_released:
    Py_XDECREF(transports);
    Py_XDECREF(facts);
    return NULL;
}

/* ---- metric dict lines ------------------------------------------------------------------ */

enum { V_NONE, V_INT, V_FLOAT, V_STR, V_PUNT };   /* PUNT: Python must read it */
typedef struct {
    int t;
    long long i;
    double f;
    const unsigned char *s;
    Py_ssize_t n;
} Val;

/* the keys MetricsParser._dict looks at */
enum {
    D_FRAC, D_ITER, D_STEP, D_GSTEP, D_STEPS, D_LOSS, D_LR, D_LR2, D_GN, D_EPOCH, D_EVAL,
    D_SPEED, D_TPS, D_TPS2, D_TPS3, D_SPS, D_MEM, D_TACC, D_ITS, D_KIND, D_RUNTIME, D_HISTORY,
    D_PARAMS, D_N
};
static const char *dkeys[D_N] = {
    "global_step/max_steps", "iteration", "step", "global_step", "steps", "loss",
    "learning_rate", "lr", "grad_norm", "epoch", "eval_loss", "train_speed(s/it)",
    "tokens_per_second", "train_tokens_per_second", "tokens_per_s", "samples_per_second",
    "memory(GiB)", "token_acc", "train_speed(iter/s)", "kind", "train_runtime", "log_history",
    "model_parameter_info"};

/* A record is a row of columns: its step, NV values (NaN where absent), which values are
 * there, which were ints, and where Python's key order puts max_steps and step_s. Rows are
 * turned into dicts only when someone reads them (rows()). */
enum { C_MAX, C_LOSS, C_LR, C_GN, C_EPOCH, C_EVAL, C_STEP_S, C_TPS, C_SPS, C_MEM, C_TACC, NV };
enum { O_MAX_FIRST = 1, O_MAX_LAST = 2, O_STEP_S_LAST = 4 };
static const char *cnames[NV] = {"max_steps", "loss", "learning_rate", "grad_norm", "epoch",
                                 "eval_loss", "step_s", "tokens_per_s", "samples_per_s",
                                 "mem_gib", "token_acc"};
static PyObject *ckeys[NV], *key_step, *key_rank;

typedef struct {
    long long step;
    double v[NV];
    uint16_t present, ints;
    uint8_t order;
} Row;

/* The grammar was checked before: strtod reads it, correctly rounded as float() does, unless
 * the C locale's decimal point is not '.', in which case Python's own reader is used. */
static int strtod_ok;

static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static double to_double(const char *s) {
    /* Clinger's fast path: a mantissa below 2^53 times or over an exact power of ten is one
     * correctly rounded operation, the same double strtod and float() give */
    const char *p = s;
    int neg = *p == '-';
    if (*p == '-' || *p == '+') p++;
    uint64_t m = 0;
    int nd = 0, e10 = 0, ok = 1;
    for (; is_digit(*p); p++, nd++) m = m * 10 + (*p - '0');
    if (*p == '.')
        for (p++; is_digit(*p); p++, nd++, e10--) m = m * 10 + (*p - '0');
    if (*p == 'e' || *p == 'E') {
        p++;
        int es = *p == '-' ? -1 : 1, x = 0;
        if (*p == '-' || *p == '+') p++;
        for (; is_digit(*p) && x < 1000; p++) x = x * 10 + (*p - '0');
        ok = !is_digit(*p);
        e10 += es * x;
    }
    if (ok && *p == 0 && nd > 0 && nd <= 19 && m < ((uint64_t)1 << 53) && e10 >= -22 &&
        e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / pow10[-e10] : d * pow10[e10];
        return neg ? -d : d;
    }
    if (strtod_ok) return strtod(s, NULL);
    double f = PyOS_string_to_double(s, NULL, NULL);
    if (f == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return NAN; }
    return f;
}

static inline const unsigned char *skip_ws(const unsigned char *p, const unsigned char *e) {
    while (p < e && (*p == ' ' || *p == '\t')) p++;
    return p;
}

/* JSON number grammar; sets *v (int when there is no fraction or exponent) */
static const unsigned char *json_number(const unsigned char *p, const unsigned char *e, Val *v,
                                        int want) {
    const unsigned char *s = p;
    int isint = 1;
    if (p < e && *p == '-') p++;
    if (p < e && *p == '0') p++;
    else if (p < e && *p >= '1' && *p <= '9') { while (p < e && is_digit(*p)) p++; }
    else return NULL;
    if (p < e && *p == '.') {
        p++;
        if (!digits(&p, e)) return NULL;
        isint = 0;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (!digits(&p, e)) return NULL;
        isint = 0;
    }
    if (!want) return p;   /* a key nobody reads: the grammar is all that matters */
    char tmp[64];
    if (p - s >= (Py_ssize_t)sizeof tmp) return NULL;
    memcpy(tmp, s, p - s);
    tmp[p - s] = 0;
    if (isint) {
        if (p - s > 18) return NULL;   /* keep clear of long long overflow */
        v->t = V_INT;
        v->i = small_int(s, p);
    } else {
        v->t = V_FLOAT;
        v->f = to_double(tmp);
    }
    return p;
}

/* metrics.py's reading of a quoted value: `[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf)`
 * becomes an int when it is all digits, else a float; anything else stays a string */
static void quoted_value(const unsigned char *s, Py_ssize_t n, Val *v) {
    const unsigned char *p = s, *e = s + n;
    v->t = V_STR;
    v->s = s;
    v->n = n;
    if (n == 0) return;
    int neg = 0, sign = 0;
    if (*p == '+' || *p == '-') {
        neg = *p == '-';
        sign = 1;
        p++;
    }
    if (e - p == 3 && (memcmp(p, "nan", 3) == 0 || memcmp(p, "inf", 3) == 0)) {
        v->t = V_FLOAT;
        v->f = memcmp(p, "nan", 3) == 0 ? (neg ? -NAN : NAN) : (neg ? -INFINITY : INFINITY);
        return;
    }
    /* one pass: the grammar, and the decimal mantissa and exponent for the fast path */
    uint64_t m = 0;
    int nd = 0, e10 = 0, intd = 0, fracd = 0, dot = 0, exp = 0;
    for (; p < e && is_digit(*p); p++, intd++)
        if (nd < 19) { m = m * 10 + (*p - '0'); nd += m > 0; } else e10++;
    if (p < e && *p == '.') {
        dot = 1;
        for (p++; p < e && is_digit(*p); p++, fracd++)
            if (nd < 19) { m = m * 10 + (*p - '0'); nd += m > 0; e10--; }
    }
    if (!(intd || fracd)) return;
    if (p < e && (*p == 'e' || *p == 'E')) {
        const unsigned char *r = p + 1;
        int es = 1, x = 0;
        if (r < e && (*r == '+' || *r == '-')) es = *r++ == '-' ? -1 : 1;
        const unsigned char *r0 = r;
        for (; r < e && is_digit(*r); r++)
            if (x < 100000) x = x * 10 + (*r - '0');
        if (r > r0) {
            p = r;
            e10 += es * x;
            exp = 1;
        }
    }
    if (p != e) return;                 /* not a number: it stays a string */
    if (!sign && !dot && !exp) {        /* all digits: an int, as str.isdigit() decides */
        if (n > 18) { v->t = V_PUNT; return; }   /* Python's int is unbounded */
        v->t = V_INT;
        v->i = small_int(s, e);
        return;
    }
    v->t = V_FLOAT;
    if (nd <= 15 && e10 >= -22 && e10 <= 22) {
        /* Clinger's fast path (see to_double) */
        double d = (double)m;
        d = e10 < 0 ? d / pow10[-e10] : d * pow10[e10];
        v->f = neg ? -d : d;
        return;
    }
    if (n >= 63) { v->t = V_PUNT; return; }
    char tmp[64];
    memcpy(tmp, s, n);
    tmp[n] = 0;
    v->f = to_double(tmp);
}

/* `:\s*(nan|-?inf|None|True|False)\b` anywhere: Python then reads the dict another way */
static int bare_token(const unsigned char *p, const unsigned char *e) {
    static const char *words[] = {"nan", "inf", "-inf", "None", "True", "False"};
    while ((p = memchr(p, ':', e - p)) != NULL) {
        const unsigned char *q = ++p;
        while (q < e && is_space(*q)) q++;
        if (q == e || !memchr("niNTF-", *q, 6)) continue;   /* no bare word starts here */
        for (int k = 0; k < 6; k++) {
            size_t n = strlen(words[k]);
            if ((size_t)(e - q) >= n && memcmp(q, words[k], n) == 0 &&
                (q + n == e || !is_word(q[n])))
                return 1;
        }
    }
    return 0;
}

static Py_ssize_t dkey_len[D_N];
/* a small hash of (length, first and last byte) → up to 4 candidate keys, -1 terminated */
#define KEY_BUCKETS 128
static signed char key_table[KEY_BUCKETS][4];
static uint64_t key_lens[256];   /* bit n: some key of length n starts with this byte */

static inline unsigned key_hash(const unsigned char *k, Py_ssize_t n) {
    return (unsigned)(n * 31 + k[0] * 7 + k[n - 1]) % KEY_BUCKETS;
}

static int key_table_init(void) {
    memset(key_table, -1, sizeof key_table);
    for (int i = 0; i < D_N; i++) {
        dkey_len[i] = (Py_ssize_t)strlen(dkeys[i]);
        signed char *b = key_table[key_hash((const unsigned char *)dkeys[i], dkey_len[i])];
        int j = 0;
        while (j < 4 && b[j] >= 0) j++;
        if (j == 4) return -1;
        b[j] = (signed char)i;
        key_lens[(unsigned char)dkeys[i][0]] |= (uint64_t)1 << dkey_len[i];
    }
    return 0;
}

static int key_index(const unsigned char *k, Py_ssize_t n) {
    if (n == 0 || n > 63 || !(key_lens[k[0]] >> n & 1)) return -1;
    const signed char *b = key_table[key_hash(k, n)];
    for (int j = 0; j < 4 && b[j] >= 0; j++)
        if (dkey_len[b[j]] == n && memcmp(dkeys[b[j]], k, n) == 0) return b[j];
    return -1;
}

/* one dict segment [p, e) into vals; 0 when it is not one this reader takes */
static int parse_dict(const unsigned char *p, const unsigned char *e, Val *vals, uint32_t *set) {
    if (e - p < 2 || *p != '{' || e[-1] != '}') return 0;
    /* one vectorised pass: non-ASCII, control characters (a tab inside a string is not
     * JSON), escapes and double quotes send the line to Python; colons are counted */
    unsigned char any = 0, ctl = 0, esc = 0, dq = 0;
    unsigned colons = 0;
    const unsigned char *q = p;
#ifdef __SSE2__
    {
        const __m128i c20 = _mm_set1_epi8(0x20), cbs = _mm_set1_epi8('\\'),
                      cdq = _mm_set1_epi8('"'), ccol = _mm_set1_epi8(':');
        unsigned bad = 0, dqs = 0;
        for (; q + 16 <= e; q += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)q);
            /* bytes >= 0x80 are negative as signed: they and the controls are < 0x20 */
            bad |= _mm_movemask_epi8(_mm_or_si128(_mm_cmplt_epi8(x, c20), _mm_cmpeq_epi8(x, cbs)));
            dqs |= _mm_movemask_epi8(_mm_cmpeq_epi8(x, cdq));
            colons += __builtin_popcount(_mm_movemask_epi8(_mm_cmpeq_epi8(x, ccol)));
        }
        if (bad) return 0;   /* which one does not matter: Python reads the line */
        dq = dqs != 0;
    }
#endif
    for (; q < e; q++) {
        any |= *q;
        ctl |= *q < 0x20;
        esc |= *q == '\\';
        dq |= *q == '"';
        colons += *q == ':';
    }
    unsigned char quote = p[1] == '"' ? '"' : '\'';
    if (any & 0x80 || ctl || esc || (quote == '\'' && dq)) return 0;
    /* Python reads a repr with `:\s*None` (nan, inf, True, ...) anywhere another way; outside
     * strings such a value fails below anyway, so only colons inside strings need a look */
    unsigned pairs = 0;
    const unsigned char *start = p, *end = e;
    *set = 0;   /* vals[k] holds a value only where bit k is set */
    p = skip_ws(p + 1, e);
    if (*p == '}') return p + 1 == e;
    for (;; pairs++) {
        if (p >= e || *p != quote) return 0;
        const unsigned char *k = ++p;
        if (!(p = memchr(p, quote, e - p))) return 0;
        int ki = key_index(k, p - k);
        p = skip_ws(p + 1, e);
        if (p >= e || *p != ':') return 0;
        p = skip_ws(p + 1, e);
        Val v = {0};
        if (p < e && *p == quote) {
            const unsigned char *s = ++p;
            if (!(p = memchr(p, quote, e - p))) return 0;
            if (quote == '\'' && ki >= 0) {
                quoted_value(s, p - s, &v);
                if (v.t == V_PUNT) return 0;
            } else {
                v.t = V_STR;
                v.s = s;
                v.n = p - s;
            }
            p++;
        } else if (!(p = json_number(p, e, &v, ki >= 0))) {
            return 0;
        }
        if (ki >= 0) {   /* a repeated key: the last one wins, as in json */
            vals[ki] = v;
            *set |= (uint32_t)1 << ki;
        }
        p = skip_ws(p, e);
        if (p < e && *p == ',') { p = skip_ws(p + 1, e); continue; }
        if (!(p < e && *p == '}' && p + 1 == e)) return 0;
        return !(quote == '\'' && colons != pairs + 1 && bare_token(start, end));
    }
}

static inline int is_num(const Val *v) { return v->t == V_INT || v->t == V_FLOAT; }

/* `\s*digits\s*` (str.strip().isdigit() for ASCII without control characters) */
static int strip_digits(const unsigned char *s, const unsigned char *e, long long *out) {
    while (s < e && *s == ' ') s++;
    while (e > s && e[-1] == ' ') e--;
    if (s == e || e - s > 18) return 0;
    long long x = 0;
    for (; s < e; s++) {
        if (!is_digit(*s)) return 0;
        x = x * 10 + (*s - '0');
    }
    *out = x;
    return 1;
}

typedef struct {
    int has_max;
    long long max_steps;
    int has_bar;
    long long bar_step;
} MState;

static inline void put(Row *r, int c, const Val *v) {
    r->present |= 1 << c;
    if (v->t == V_INT) {
        r->ints |= 1 << c;
        r->v[c] = (double)v->i;
    } else {
        r->v[c] = v->f;
    }
}

/* MetricsParser._dict + _finish for a parsed dict: 1 with the row, 0 when the dict makes no
 * record, -1 when Python must read it. */
static const Val NONE_VAL = {.t = V_NONE};

static int make_row(const Val *vals, uint32_t set, MState *st, Row *r) {
#define D(k) ((set >> (k) & 1) ? &vals[k] : &NONE_VAL)   /* absent keys read as V_NONE */
    if (set & (1u << D_KIND | 1u << D_RUNTIME | 1u << D_HISTORY | 1u << D_PARAMS)) return -1;
    int has_step = 0, has_max = 0;
    long long step = 0, maxs = 0;
    const Val *frac = D(D_FRAC);
    /* `d.get("global_step/max_steps") or d.get("iteration")` */
    int truthy = frac->t == V_STR ? frac->n > 0 : frac->t == V_INT ? frac->i != 0
               : frac->t == V_FLOAT ? frac->f != 0.0 : 0;
    if (!truthy) frac = D(D_ITER);
    memset(r, 0, sizeof *r);
    if (frac->t == V_STR) {
        const unsigned char *sl = memchr(frac->s, '/', frac->n);
        if (sl) {
            has_step = strip_digits(frac->s, sl, &step);
            has_max = strip_digits(sl + 1, frac->s + frac->n, &maxs);
            if (has_max && !has_step) r->order |= O_MAX_FIRST;
        }
    }
    for (int k = D_STEP; k <= D_STEPS && !has_step; k++) {
        if (!is_num(D(k))) continue;
        const Val *v = D(k);
        if (v->t == V_FLOAT) {
            if (!isfinite(v->f) || fabs(v->f) > 9e18) return -1;
            step = (long long)v->f;
        } else {
            step = v->i;
        }
        has_step = 1;
    }
    int has_loss = is_num(D(D_LOSS)), has_eval = is_num(D(D_EVAL));
    int has_lr = is_num(D(D_LR)) || is_num(D(D_LR2)), has_gn = is_num(D(D_GN));
    if (!(has_loss || has_eval || has_lr || has_gn)) return 0;
    if (!has_step) return -1;   /* the step comes from the bar or a count: Python's rules */
    r->step = step;
    for (int c = 0; c < NV; c++) r->v[c] = NAN;
    static const int pairs[][2] = {{D_LOSS, C_LOSS}, {D_LR, C_LR}, {D_LR2, C_LR},
                                   {D_GN, C_GN}, {D_EPOCH, C_EPOCH}, {D_EVAL, C_EVAL},
                                   {D_SPEED, C_STEP_S}, {D_TPS, C_TPS}, {D_TPS2, C_TPS},
                                   {D_TPS3, C_TPS}, {D_SPS, C_SPS}, {D_MEM, C_MEM},
                                   {D_TACC, C_TACC}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        const Val *v = D(pairs[k][0]);
        if (is_num(v) && !(r->present >> pairs[k][1] & 1)) put(r, pairs[k][1], v);
    }
    const Val *its = D(D_ITS);
    double speed = its->t == V_INT ? (double)its->i : its->t == V_FLOAT ? its->f : 0.0;
    if (is_num(its) && speed > 0) {
        if (!(r->present >> C_STEP_S & 1)) r->order |= O_STEP_S_LAST;
        Val q = {.t = V_FLOAT, .f = 1.0 / speed};
        r->ints &= ~(1 << C_STEP_S);
        put(r, C_STEP_S, &q);
    }
    if (has_max) {
        Val q = {.t = V_INT, .i = maxs};
        put(r, C_MAX, &q);
        st->has_max = 1;
        st->max_steps = maxs;
    } else if (st->has_max && st->max_steps != 0) {
        Val q = {.t = V_INT, .i = st->max_steps};
        put(r, C_MAX, &q);
        r->order |= O_MAX_LAST;
    }
    return 1;
#undef D
}

/* growable column buffers of one call */
typedef struct {
    Py_ssize_t n, cap;
    long long *step;
    double *v;
    uint16_t *present, *ints;
    uint8_t *order;
} Cols;

static int cols_add(Cols *c, const Row *r) {
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap ? c->cap * 2 : 1024;
        long long *s = PyMem_Realloc(c->step, cap * sizeof *s);
        if (s) c->step = s;
        double *v = PyMem_Realloc(c->v, cap * NV * sizeof *v);
        if (v) c->v = v;
        uint16_t *pr = PyMem_Realloc(c->present, cap * sizeof *pr);
        if (pr) c->present = pr;
        uint16_t *in = PyMem_Realloc(c->ints, cap * sizeof *in);
        if (in) c->ints = in;
        uint8_t *o = PyMem_Realloc(c->order, cap);
        if (o) c->order = o;
        if (!s || !v || !pr || !in || !o) { PyErr_NoMemory(); return -1; }
        c->cap = cap;
    }
    Py_ssize_t i = c->n++;
    c->step[i] = r->step;
    memcpy(&c->v[i * NV], r->v, sizeof r->v);
    c->present[i] = r->present;
    c->ints[i] = r->ints;
    c->order[i] = r->order;
    return 0;
}

static void cols_free(Cols *c) {
    PyMem_Free(c->step);
    PyMem_Free(c->v);
    PyMem_Free(c->present);
    PyMem_Free(c->ints);
    PyMem_Free(c->order);
}

/* the first "%|" in [p, e) */
static const unsigned char *find_bar_mark(const unsigned char *p, const unsigned char *e) {
    while (p + 1 < e && (p = memchr(p, '%', e - p - 1)) != NULL) {
        if (p[1] == '|') return p;
        p++;
    }
    return NULL;
}

static int has_step_word(const unsigned char *p, const unsigned char *e) {
    while (p + 3 < e && (p = memchr(p, 's', e - p - 3)) != NULL) {
        if (memcmp(p, "step", 4) == 0) return 1;
        p++;
    }
    return 0;
}

/* assemble.py's _is_bar */
static int is_bar(const unsigned char *p, const unsigned char *e) {
    const unsigned char *q = find_bar_mark(p, e);
    return q && memchr(q + 2, '|', e - q - 2) != NULL;
}

/* tqdm.py's bar: the first `\d+%\|[^|]*\|\s*(\d+)/(\d+)`. 1 with n/total, 0 when not a bar,
 * -1 when Python must read it (non-ASCII outside the bar body, a dict, a `step`). */
static int bar_counts(const unsigned char *p, const unsigned char *e, long long *n,
                      long long *total) {
    if (memchr(p, '{', e - p)) return -1;
    if (has_step_word(p, e)) return -1;
    for (const unsigned char *q = p; (q = find_bar_mark(q, e)) != NULL; q++) {
        if (!(q > p && is_digit(q[-1]))) continue;
        const unsigned char *b = memchr(q + 2, '|', e - q - 2);
        if (!b) continue;
        /* only the bar body may hold non-ASCII (block characters): elsewhere a Unicode digit
         * or space would make Python's regex read the line differently */
        for (const unsigned char *a = p; a < q; a++)
            if (*a >= 0x80) return -1;
        for (const unsigned char *a = b; a < e; a++)
            if (*a >= 0x80) return -1;
        const unsigned char *c = b + 1;
        while (c < e && is_space(*c)) c++;
        const unsigned char *ns = c;
        if (!digits(&c, e) || c >= e || *c != '/') continue;
        const unsigned char *ts = ++c;
        if (!digits(&c, e)) continue;
        if (c - ns > 18 || c - ts > 18) return -1;
        *n = small_int(ns, ts - 1);
        *total = small_int(ts, c);
        return 1;
    }
    return 0;
}

/* MetricsParser._bar: a bar with a total sets the bar step, and max_steps unless known.
 * -1 when Python must read the bar. */
static int apply_bar(const unsigned char *p, const unsigned char *e, MState *s) {
    long long n, total;
    int rc = bar_counts(p, e, &n, &total);
    if (rc > 0 && total > 0) {
        s->has_bar = 1;
        s->bar_step = n;
        if (!(s->has_max && s->max_steps)) {
            s->has_max = 1;
            s->max_steps = total;
        }
    }
    return rc < 0 ? -1 : 0;
}

/* one physical line: 1 handled (record appended when the line has one), 0 Python's, -2 error */
static int metric_line(const unsigned char *p, const unsigned char *e, MState *st, Cols *cols) {
    if (p == e) return 1;   /* an empty line: nothing to read */
    MState s = *st;
    Row row;
    int have = 0;
    const unsigned char *seg = p;
    const unsigned char *pend_b = NULL, *pend_e = NULL;   /* the last bar of a run of bars */
    int dicts = 0;
    while (seg <= e) {
        const unsigned char *se = memchr(seg, '\r', e - seg);
        if (!se) se = e;
        const unsigned char *a = seg;
        while (a < se && (*a == ' ' || *a == '\t' || *a == '\v' || *a == '\f')) a++;
        if (a < se) {
            int bar = is_bar(seg, se);
            if (pend_b && !bar) {
                if (apply_bar(pend_b, pend_e, &s) < 0) goto python;
                pend_b = NULL;
            }
            if (bar) {
                pend_b = seg;
                pend_e = se;
            } else {
                Val vals[D_N];
                uint32_t set;
                if (dicts++ || !parse_dict(seg, se, vals, &set)) goto python;
                int rc = make_row(vals, set, &s, &row);
                if (rc < 0) goto python;
                have = rc;
            }
        }
        if (se == e) break;
        seg = se + 1;
    }
    if (pend_b && apply_bar(pend_b, pend_e, &s) < 0) goto python;
    /* bars without a record: Python keeps their progress entries (used while no dict came) */
    if (!have) goto python;
    if (cols_add(cols, &row) < 0) return -2;
    *st = s;
    return 1;
python:
    return 0;
}

static PyObject *bytes_of(const void *p, Py_ssize_t n) {
    return PyBytes_FromStringAndSize(n ? (const char *)p : "", n);
}

static PyObject *py_dict_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, end;
    PyObject *maxo, *baro;
    if (!PyArg_ParseTuple(args, "y*nnOO", &view, &pos, &end, &maxo, &baro)) return NULL;
    if (pos < 0 || end > view.len || pos > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pos/end outside the buffer");
        return NULL;
    }
    MState st = {0};
    if (maxo != Py_None) {
        st.has_max = 1;
        st.max_steps = PyLong_AsLongLong(maxo);
    }
    if (baro != Py_None) {
        st.has_bar = 1;
        st.bar_step = PyLong_AsLongLong(baro);
    }
    if (PyErr_Occurred()) { PyBuffer_Release(&view); return NULL; }
    Cols c = {0};
    const unsigned char *buf = view.buf, *p = buf + pos, *e = buf + end;
    while (p < e) {
        const unsigned char *nl = memchr(p, '\n', e - p);
        if (!nl) break;
        int rc = metric_line(p, nl, &st, &c);
        if (rc == -2) { PyBuffer_Release(&view); cols_free(&c); return NULL; }
        if (rc == 0) break;
        p = nl + 1;
    }
    PyBuffer_Release(&view);
    int ascending = 1;   /* strictly rising steps: the caller can skip merging */
    for (Py_ssize_t i = 1; i < c.n && ascending; i++) ascending = c.step[i - 1] < c.step[i];
    PyObject *mo = st.has_max ? PyLong_FromLongLong(st.max_steps) : Py_NewRef(Py_None);
    PyObject *bo = st.has_bar ? PyLong_FromLongLong(st.bar_step) : Py_NewRef(Py_None);
    PyObject *res = Py_BuildValue(
        "nnNNNNNiNN", (Py_ssize_t)(p - buf), c.n, bytes_of(c.step, c.n * sizeof *c.step),
        bytes_of(c.v, c.n * NV * sizeof *c.v), bytes_of(c.present, c.n * sizeof *c.present),
        bytes_of(c.ints, c.n * sizeof *c.ints), bytes_of(c.order, c.n), ascending, mo, bo);
    cols_free(&c);
    return res;
}

static int set_col(PyObject *d, PyObject *key, const double *v, int c, uint16_t ints) {
    PyObject *o = ints >> c & 1 ? PyLong_FromLongLong((long long)v[c]) : PyFloat_FromDouble(v[c]);
    if (!o) return -1;
    int rc = PyDict_SetItem(d, key, o);
    Py_DECREF(o);
    return rc;
}

/* rows(steps, values, present, ints, order, rank, start, stop) -> [record dict, ...] with the
 * keys in the order MetricsParser builds them */
static PyObject *py_rows(PyObject *self, PyObject *args) {
    Py_buffer b[5];
    PyObject *rank;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*Onn", &b[0], &b[1], &b[2], &b[3], &b[4], &rank,
                          &start, &stop))
        return NULL;
    Py_ssize_t n = b[4].len;
    PyObject *out = NULL;
    if (b[0].len != n * (Py_ssize_t)sizeof(long long) ||
        b[1].len != n * NV * (Py_ssize_t)sizeof(double) || b[2].len != 2 * n ||
        b[3].len != 2 * n || start < 0 || stop > n || start > stop) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        goto done;
    }
    const long long *step = b[0].buf;
    const double *v = b[1].buf;
    const uint16_t *present = b[2].buf, *ints = b[3].buf;
    const uint8_t *order = b[4].buf;
    if (!(out = PyList_New(stop - start))) goto done;
    for (Py_ssize_t i = start; i < stop; i++) {
        const double *row = &v[i * NV];
        uint16_t pr = present[i];
        uint8_t o = order[i];
        PyObject *d = PyDict_New(), *s = NULL;
        if (!d) goto fail;
        PyList_SET_ITEM(out, i - start, d);
        int max_mid = pr >> C_MAX & 1 && !(o & (O_MAX_FIRST | O_MAX_LAST));
        if (o & O_MAX_FIRST && set_col(d, ckeys[C_MAX], row, C_MAX, ints[i]) < 0) goto fail;
        if (!(s = PyLong_FromLongLong(step[i])) || PyDict_SetItem(d, key_step, s) < 0) {
            Py_XDECREF(s);
            goto fail;
        }
        Py_DECREF(s);
        if (max_mid && set_col(d, ckeys[C_MAX], row, C_MAX, ints[i]) < 0) goto fail;
        for (int c = C_LOSS; c < NV; c++) {
            if (!(pr >> c & 1) || (c == C_STEP_S && o & O_STEP_S_LAST)) continue;
            if (set_col(d, ckeys[c], row, c, ints[i]) < 0) goto fail;
        }
        if (o & O_STEP_S_LAST && set_col(d, ckeys[C_STEP_S], row, C_STEP_S, ints[i]) < 0)
            goto fail;
        if (o & O_MAX_LAST && set_col(d, ckeys[C_MAX], row, C_MAX, ints[i]) < 0) goto fail;
        if (rank != Py_None && PyDict_SetItem(d, key_rank, rank) < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    for (int k = 0; k < 5; k++) PyBuffer_Release(&b[k]);
    return out;
}

/* -- a float's repr without dtoa ---------------------------------------------------------
 *
 * repr(float) is David Gay's dtoa in shortest mode, ~0.5 us a value: most of `tunedeck metrics
 * --json`'s time on a run whose columns all vary (nine floats a record). Grisu3 (Loitsch,
 * "Printing Floating-Point Numbers Quickly and Accurately with Integers", PLDI 2010) finds the
 * same digits, the shortest that read back to the value and the closest of those, in 64-bit
 * integer arithmetic, or says that it cannot be sure (~0.5% of doubles): those go to Python's
 * dtoa. float_repr then lays the digits out as repr does. */
typedef struct {
    uint64_t f;
    int e;
} DiyFp;

/* 10^k ~ f * 2^e for k = -348, -340, ..., 340: f rounded to nearest (generated with exact
 * integer arithmetic) */
static const struct {
    uint64_t f;
    int16_t e, k;
} cached_pow[] = {
    {0xfa8fd5a0081c0288ULL, -1220, -348}, {0xbaaee17fa23ebf76ULL, -1193, -340},
    {0x8b16fb203055ac76ULL, -1166, -332}, {0xcf42894a5dce35eaULL, -1140, -324},
    {0x9a6bb0aa55653b2dULL, -1113, -316}, {0xe61acf033d1a45dfULL, -1087, -308},
    {0xab70fe17c79ac6caULL, -1060, -300}, {0xff77b1fcbebcdc4fULL, -1034, -292},
    {0xbe5691ef416bd60cULL, -1007, -284}, {0x8dd01fad907ffc3cULL, -980, -276},
    {0xd3515c2831559a83ULL, -954, -268}, {0x9d71ac8fada6c9b5ULL, -927, -260},
    {0xea9c227723ee8bcbULL, -901, -252}, {0xaecc49914078536dULL, -874, -244},
    {0x823c12795db6ce57ULL, -847, -236}, {0xc21094364dfb5637ULL, -821, -228},
    {0x9096ea6f3848984fULL, -794, -220}, {0xd77485cb25823ac7ULL, -768, -212},
    {0xa086cfcd97bf97f4ULL, -741, -204}, {0xef340a98172aace5ULL, -715, -196},
    {0xb23867fb2a35b28eULL, -688, -188}, {0x84c8d4dfd2c63f3bULL, -661, -180},
    {0xc5dd44271ad3cdbaULL, -635, -172}, {0x936b9fcebb25c996ULL, -608, -164},
    {0xdbac6c247d62a584ULL, -582, -156}, {0xa3ab66580d5fdaf6ULL, -555, -148},
    {0xf3e2f893dec3f126ULL, -529, -140}, {0xb5b5ada8aaff80b8ULL, -502, -132},
    {0x87625f056c7c4a8bULL, -475, -124}, {0xc9bcff6034c13053ULL, -449, -116},
    {0x964e858c91ba2655ULL, -422, -108}, {0xdff9772470297ebdULL, -396, -100},
    {0xa6dfbd9fb8e5b88fULL, -369, -92}, {0xf8a95fcf88747d94ULL, -343, -84},
    {0xb94470938fa89bcfULL, -316, -76}, {0x8a08f0f8bf0f156bULL, -289, -68},
    {0xcdb02555653131b6ULL, -263, -60}, {0x993fe2c6d07b7facULL, -236, -52},
    {0xe45c10c42a2b3b06ULL, -210, -44}, {0xaa242499697392d3ULL, -183, -36},
    {0xfd87b5f28300ca0eULL, -157, -28}, {0xbce5086492111aebULL, -130, -20},
    {0x8cbccc096f5088ccULL, -103, -12}, {0xd1b71758e219652cULL, -77, -4},
    {0x9c40000000000000ULL, -50, 4}, {0xe8d4a51000000000ULL, -24, 12},
    {0xad78ebc5ac620000ULL, 3, 20}, {0x813f3978f8940984ULL, 30, 28},
    {0xc097ce7bc90715b3ULL, 56, 36}, {0x8f7e32ce7bea5c70ULL, 83, 44},
    {0xd5d238a4abe98068ULL, 109, 52}, {0x9f4f2726179a2245ULL, 136, 60},
    {0xed63a231d4c4fb27ULL, 162, 68}, {0xb0de65388cc8ada8ULL, 189, 76},
    {0x83c7088e1aab65dbULL, 216, 84}, {0xc45d1df942711d9aULL, 242, 92},
    {0x924d692ca61be758ULL, 269, 100}, {0xda01ee641a708deaULL, 295, 108},
    {0xa26da3999aef774aULL, 322, 116}, {0xf209787bb47d6b85ULL, 348, 124},
    {0xb454e4a179dd1877ULL, 375, 132}, {0x865b86925b9bc5c2ULL, 402, 140},
    {0xc83553c5c8965d3dULL, 428, 148}, {0x952ab45cfa97a0b3ULL, 455, 156},
    {0xde469fbd99a05fe3ULL, 481, 164}, {0xa59bc234db398c25ULL, 508, 172},
    {0xf6c69a72a3989f5cULL, 534, 180}, {0xb7dcbf5354e9beceULL, 561, 188},
    {0x88fcf317f22241e2ULL, 588, 196}, {0xcc20ce9bd35c78a5ULL, 614, 204},
    {0x98165af37b2153dfULL, 641, 212}, {0xe2a0b5dc971f303aULL, 667, 220},
    {0xa8d9d1535ce3b396ULL, 694, 228}, {0xfb9b7cd9a4a7443cULL, 720, 236},
    {0xbb764c4ca7a44410ULL, 747, 244}, {0x8bab8eefb6409c1aULL, 774, 252},
    {0xd01fef10a657842cULL, 800, 260}, {0x9b10a4e5e9913129ULL, 827, 268},
    {0xe7109bfba19c0c9dULL, 853, 276}, {0xac2820d9623bf429ULL, 880, 284},
    {0x80444b5e7aa7cf85ULL, 907, 292}, {0xbf21e44003acdd2dULL, 933, 300},
    {0x8e679c2f5e44ff8fULL, 960, 308}, {0xd433179d9c8cb841ULL, 986, 316},
    {0x9e19db92b4e31ba9ULL, 1013, 324}, {0xeb96bf6ebadf77d9ULL, 1039, 332},
    {0xaf87023b9bf0ee6bULL, 1066, 340},
};
#define N_CACHED_POW ((int)(sizeof cached_pow / sizeof cached_pow[0]))

/* the upper 64 bits of the 128-bit product, rounded (half up): the error bound Grisu assumes */
static DiyFp fp_mul(DiyFp x, DiyFp y) {
    const uint64_t m32 = 0xFFFFFFFFu;
    uint64_t a = x.f >> 32, b = x.f & m32, c = y.f >> 32, d = y.f & m32;
    uint64_t ac = a * c, bc = b * c, ad = a * d, bd = b * d;
    uint64_t tmp = (bd >> 32) + (ad & m32) + (bc & m32) + (1u << 31);
    DiyFp r = {ac + (ad >> 32) + (bc >> 32) + (tmp >> 32), x.e + y.e + 64};
    return r;
}

static DiyFp fp_normalize(DiyFp x) {
#if defined(__GNUC__) || defined(__clang__)
    int s = __builtin_clzll(x.f);
    x.f <<= s;
    x.e -= s;
#else
    while (!(x.f & (1ULL << 63))) {
        x.f <<= 1;
        x.e--;
    }
#endif
    return x;
}

/* moves the last digit down while that brings it closer to the value; 0 when the result may
 * not be the closest or may lie outside the boundaries */
static int round_weed(char *buf, int len, uint64_t dist_high_w, uint64_t unsafe, uint64_t rest,
                      uint64_t ten_kappa, uint64_t unit) {
    uint64_t small = dist_high_w - unit, big = dist_high_w + unit;
    while (rest < small && unsafe - rest >= ten_kappa &&
           (rest + ten_kappa < small || small - rest >= rest + ten_kappa - small)) {
        buf[len - 1]--;
        rest += ten_kappa;
    }
    if (rest < big && unsafe - rest >= ten_kappa &&
        (rest + ten_kappa < big || big - rest > rest + ten_kappa - big))
        return 0;
    return 2 * unit <= rest && rest <= unsafe - 4 * unit;
}

/* the shortest digits in (low, high), w the scaled value; all three share w.e in [-60, -32] */
static int digit_gen(DiyFp low, DiyFp w, DiyFp high, char *buf, int *len, int *kappa) {
    uint64_t unit = 1;
    uint64_t too_low = low.f - unit, too_high = high.f + unit;
    uint64_t unsafe = too_high - too_low;
    int sh = -w.e;
    uint64_t one = 1ULL << sh;
    uint32_t integrals = (uint32_t)(too_high >> sh);
    uint64_t fractionals = too_high & (one - 1);
    uint32_t divisor = 1;
    int k = 1;   /* integrals >= 8: too_high >= 2^63 */
    while (k < 10 && integrals / divisor >= 10) {
        divisor *= 10;
        k++;
    }
    *len = 0;
    while (k > 0) {
        buf[(*len)++] = (char)('0' + integrals / divisor);
        integrals %= divisor;
        k--;
        uint64_t rest = ((uint64_t)integrals << sh) + fractionals;
        if (rest < unsafe) {
            *kappa = k;
            return round_weed(buf, *len, too_high - w.f, unsafe, rest, (uint64_t)divisor << sh,
                              unit);
        }
        divisor /= 10;
    }
    for (;;) {
        if (*len >= 18) return 0;   /* never for a double; Python's dtoa would decide */
        fractionals *= 10;
        unit *= 10;
        unsafe *= 10;
        buf[(*len)++] = (char)('0' + (int)(fractionals >> sh));
        fractionals &= one - 1;
        k--;
        if (fractionals < unsafe) {
            *kappa = k;
            return round_weed(buf, *len, (too_high - w.f) * unit, unsafe, fractionals, one, unit);
        }
    }
}

/* v > 0 and finite: its shortest digits, v = digits * 10^K; 0 when Grisu3 cannot be sure */
static int grisu3(double v, char *buf, int *len, int *K) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint64_t sig = bits & 0xFFFFFFFFFFFFFULL;
    int be = (int)(bits >> 52 & 0x7FF);
    DiyFp w = {be ? sig | 1ULL << 52 : sig, be ? be - 1075 : -1074};
    /* the halfway points to the neighbours; below a power of two the lower gap is half */
    DiyFp hi = fp_normalize((DiyFp){(w.f << 1) + 1, w.e - 1});
    DiyFp lo = sig == 0 && be > 1 ? (DiyFp){(w.f << 2) - 1, w.e - 2}
                                   : (DiyFp){(w.f << 1) - 1, w.e - 1};
    lo.f <<= lo.e - hi.e;
    lo.e = hi.e;
    w = fp_normalize(w);
    /* the cached power that brings w's exponent into [-60, -32] */
    int i = (int)ceil((-60 - (w.e + 64) + 63) * 0.30102999566398114);
    i = (348 + i - 1) / 8 + 1;
    while (i < N_CACHED_POW - 1 && w.e + cached_pow[i].e + 64 < -60) i++;
    while (i > 0 && w.e + cached_pow[i].e + 64 > -32) i--;
    if (i < 0 || i >= N_CACHED_POW) return 0;
    int e = w.e + cached_pow[i].e + 64;
    if (e < -60 || e > -32) return 0;
    DiyFp c = {cached_pow[i].f, cached_pow[i].e};
    int kappa;
    if (!digit_gen(fp_mul(lo, c), fp_mul(w, c), fp_mul(hi, c), buf, len, &kappa)) return 0;
    while (*len > 1 && buf[*len - 1] == '0') {   /* repr never ends its digits in 0 */
        (*len)--;
        kappa++;
    }
    *K = kappa - cached_pow[i].k;
    return 1;
}

/* repr(d) of a finite d into out (32 bytes): its length, or -1 when Grisu3 is unsure */
static int float_repr(double d, char *out) {
    char digits[24];
    int n, K;
    char *p = out;
    if (signbit(d)) {
        *p++ = '-';
        d = -d;
    }
    if (d == 0.0) {
        memcpy(p, "0.0", 3);
        return (int)(p - out) + 3;
    }
    if (!grisu3(d, digits, &n, &K)) return -1;
    int decpt = n + K;   /* d = 0.digits * 10^decpt */
    if (decpt <= -4 || decpt > 16) {   /* repr's rule for an exponent */
        *p++ = digits[0];
        if (n > 1) {
            *p++ = '.';
            memcpy(p, digits + 1, n - 1);
            p += n - 1;
        }
        int x = decpt - 1;
        *p++ = 'e';
        *p++ = x < 0 ? '-' : '+';
        if (x < 0) x = -x;
        if (x >= 100) {
            *p++ = (char)('0' + x / 100);
            x %= 100;
        }
        *p++ = (char)('0' + x / 10);
        *p++ = (char)('0' + x % 10);
    } else if (decpt <= 0) {
        *p++ = '0';
        *p++ = '.';
        memset(p, '0', -decpt);
        p += -decpt;
        memcpy(p, digits, n);
        p += n;
    } else if (decpt < n) {
        memcpy(p, digits, decpt);
        p += decpt;
        *p++ = '.';
        memcpy(p, digits + decpt, n - decpt);
        p += n - decpt;
    } else {
        memcpy(p, digits, n);
        p += n;
        memset(p, '0', decpt - n);
        p += decpt - n;
        memcpy(p, ".0", 2);
        p += 2;
    }
    return (int)(p - out);
}

/* float_text(x, fast_only=False) -> repr(x), through float_repr (None with fast_only when
 * Grisu3 is unsure): for the tests that hold it to repr */
static PyObject *py_float_text(PyObject *self, PyObject *args) {
    double d;
    int fast_only = 0;
    if (!PyArg_ParseTuple(args, "d|p", &d, &fast_only)) return NULL;
    char out[32];
    int n = isfinite(d) ? float_repr(d, out) : -1;
    if (n >= 0) return PyUnicode_DecodeASCII(out, n, NULL);
    if (fast_only) Py_RETURN_NONE;
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) return NULL;
    PyObject *r = PyUnicode_FromString(s);
    PyMem_Free(s);
    return r;
}

/* step_text(rows, start, stop_step, rank, need_max_steps) -> (text, next)
 *
 * `tunedeck metrics --json`'s text of a trainer's full step rows (core/views/metrics.py
 * `_FULL`): rows are run.db's (step, t, loss, lr, grad_norm, tokens_per_s, step_s, epoch,
 * tokens, data_wait_s, mem_gib, max_steps, loss_nan) tuples in step order; from rows[start]
 * on, each row below stop_step with every value an int or a finite float, no loss_nan and
 * (with need_max_steps) a max_steps is written as json.dump(indent=2) prints its record inside
 * a list (floats as repr), the records joined by ",\n". It stops at the first other row:
 * `next` is its index, for Python to read. Floats are written by float_repr (Python's own
 * dtoa where Grisu3 is unsure), so the text is byte for byte what the Python path prints. */
typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (b->n + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n) cap *= 2;
        char *p = PyMem_Realloc(b->p, cap);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* a column's last float and its repr: columns that repeat a value from row to row (tokens,
 * memory, a constant learning rate) are not converted again */
typedef struct {
    double d;
    int n;   /* 0: nothing kept */
    char s[40];
} Last;

/* an exact int or a finite float as repr writes it; 1 if the value is neither */
static int buf_num_at(Buf *b, PyObject *v, Last *last) {
    char tmp[32];
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (!isfinite(d)) return 1;
        if (last && last->n && memcmp(&last->d, &d, sizeof d) == 0)   /* same bits: -0.0 too */
            return buf_put(b, last->s, last->n);
        int n = float_repr(d, tmp);
        if (n >= 0) {
            if (last) {
                memcpy(last->s, tmp, n);
                last->d = d;
                last->n = n;
            }
            return buf_put(b, tmp, n);
        }
        char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!s) return -1;
        n = (int)strlen(s);
        int rc = buf_put(b, s, n);
        if (last && n < (int)sizeof last->s) {
            memcpy(last->s, s, n);
            last->d = d;
            last->n = n;
        }
        PyMem_Free(s);
        return rc;
    }
    if (PyLong_CheckExact(v)) {
        int over = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &over);
        if (over) return 1;
        if (x == -1 && PyErr_Occurred()) return -1;
        /* digits from the end (snprintf's format parsing cost as much as the row) */
        char *e = tmp + sizeof tmp, *p = e;
        unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
        do {
            *--p = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (x < 0) *--p = '-';
        return buf_put(b, p, e - p);
    }
    return 1;
}

static int buf_num(Buf *b, PyObject *v) { return buf_num_at(b, v, NULL); }

/* output key (and the text before the value) of each row column written, in output order */
static const int step_cols[] = {2, 3, 4, 5, 6, 7, -1, 1, 8, 9, 10};
static const char *step_keys[] = {
    ",\n    \"loss\": ", ",\n    \"learning_rate\": ", ",\n    \"grad_norm\": ",
    ",\n    \"tokens_per_s\": ", ",\n    \"step_s\": ", ",\n    \"epoch\": ", ",\n    \"rank\": ",
    ",\n    \"t\": ", ",\n    \"tokens\": ", ",\n    \"data_wait_s\": ", ",\n    \"mem_gib\": "};

static PyObject *py_step_text(PyObject *self, PyObject *args) {
    PyObject *rows, *rank;
    Py_ssize_t start;
    long long stop_step;
    int need_max;
    if (!PyArg_ParseTuple(args, "O!nLOp", &PyList_Type, &rows, &start, &stop_step, &rank,
                          &need_max))
        return NULL;
    if (!PyLong_CheckExact(rank)) {
        PyErr_SetString(PyExc_TypeError, "rank must be an int");
        return NULL;
    }
    /* one buffer for every call (under the GIL): a 1M-step run's 390 MB of text is written
     * into the same pages, not into fresh ones each call */
    static Buf scratch = {NULL, 0, 0};
    Buf b = scratch;
    b.n = 0;
    Last last[11];
    for (int k = 0; k < 11; k++) last[k].n = 0;
    Py_ssize_t n = PyList_GET_SIZE(rows), i = start < 0 ? 0 : start;
    for (; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 13) break;
        PyObject *step = PyTuple_GET_ITEM(row, 0), *ms = PyTuple_GET_ITEM(row, 11);
        if (!PyLong_CheckExact(step) || PyTuple_GET_ITEM(row, 12) != Py_None) break;
        int over = 0;
        long long s = PyLong_AsLongLongAndOverflow(step, &over);
        if (over || s >= stop_step) break;
        int has_max = 0;   /* written when truthy, as Python's `if row[11]` */
        if (ms != Py_None) {
            if (!PyLong_CheckExact(ms)) break;
            has_max = PyObject_IsTrue(ms);
        }
        if (!has_max && need_max) break;
        int ok = 1;
        for (int c = 1; c <= 10; c++) {
            PyObject *v = PyTuple_GET_ITEM(row, c);
            if (v == Py_None || !(PyLong_CheckExact(v) || (PyFloat_CheckExact(v) &&
                                  isfinite(PyFloat_AS_DOUBLE(v))))) {
                ok = 0;
                break;
            }
        }
        if (!ok) break;
        Py_ssize_t mark = b.n;
        const char *head = b.n ? ",\n  {\n    \"step\": " : "  {\n    \"step\": ";
        int rc = buf_put(&b, head, strlen(head));
        if (!rc) rc = buf_num(&b, step);
        for (int k = 0; k < 11 && !rc; k++) {
            rc = buf_put(&b, step_keys[k], strlen(step_keys[k]));
            if (!rc)
                rc = buf_num_at(&b, step_cols[k] < 0 ? rank : PyTuple_GET_ITEM(row, step_cols[k]),
                                &last[k]);
        }
        if (!rc && has_max) {
            rc = buf_put(&b, ",\n    \"max_steps\": ", strlen(",\n    \"max_steps\": "));
            if (!rc) rc = buf_num(&b, ms);
        }
        if (!rc) rc = buf_put(&b, "\n  }", 4);
        if (rc < 0) {
            scratch = b;
            return NULL;
        }
        if (rc > 0) {   /* a value repr cannot write (checked above; kept for safety) */
            b.n = mark;
            break;
        }
    }
    scratch = b;
    PyObject *text = PyUnicode_New(b.n, 127);   /* ASCII by construction: no decoding pass */
    if (!text) return NULL;
    if (b.n) memcpy(PyUnicode_1BYTE_DATA(text), b.p, b.n);
    return Py_BuildValue("(Nn)", text, i);
}

/* pick_steps(lines, keys) -> [None | (rank, step, t, *values, has_first_key), ...]
 *
 * The agent's reading of a trainer's step event line without a dict (core/store/store.py):
 * a line that is one flat JSON object with "kind": "step", an int "rank", an int "step" >= 0
 * and a number "t" gives its rank, step, t and the value of each of `keys` (an int or a
 * finite float as json.loads makes it, None where absent or null), and whether the first key
 * was there at all. Any other line is None, for json.loads: other kinds, escapes in strings,
 * nested values, NaN/Infinity, a bool or a string under one of `keys`, a repeated key the
 * agent reads, malformed JSON. */
#define PICK_MAX_KEYS 32

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* a JSON number at p (strict grammar); its end, or NULL */
static const char *pick_number(const char *p, const char *end, int *is_float) {
    const char *q = p;
    *is_float = 0;
    if (q < end && *q == '-') q++;
    if (q >= end) return NULL;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') while (q < end && *q >= '0' && *q <= '9') q++;
    else return NULL;
    if (q < end && *q == '.') {
        q++;
        *is_float = 1;
        if (q >= end || *q < '0' || *q > '9') return NULL;
        while (q < end && *q >= '0' && *q <= '9') q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        *is_float = 1;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || *q < '0' || *q > '9') return NULL;
        while (q < end && *q >= '0' && *q <= '9') q++;
    }
    return q;
}

/* the number's object as json.loads makes it (int or float); NULL with no error set when
 * Python should read it (too long, not finite, an int that may not fit SQLite's 64 bits) */
static PyObject *pick_obj(const char *p, const char *q, int is_float) {
    char tmp[64];
    Py_ssize_t n = q - p;
    if (n >= (Py_ssize_t)sizeof tmp) return NULL;
    memcpy(tmp, p, n);
    tmp[n] = 0;
    if (!is_float) return n > 18 ? NULL : PyLong_FromString(tmp, NULL, 10);
    double d = PyOS_string_to_double(tmp, NULL, NULL);
    if (d == -1.0 && PyErr_Occurred()) return NULL;
    if (!isfinite(d)) return NULL;
    return PyFloat_FromDouble(d);
}

/* index of key [k, k+n) among the wanted ones: -1 rank, -2 step, -3 t, -4 kind, >= 0 keys[i],
 * -9 none */
static int pick_key(const char *k, Py_ssize_t n, const char **names, const Py_ssize_t *lens,
                     int nkeys) {
    if (n == 4 && !memcmp(k, "rank", 4)) return -1;
    if (n == 4 && !memcmp(k, "step", 4)) return -2;
    if (n == 1 && k[0] == 't') return -3;
    if (n == 4 && !memcmp(k, "kind", 4)) return -4;
    for (int i = 0; i < nkeys; i++)
        if (lens[i] == n && !memcmp(names[i], k, n)) return i;
    return -9;
}

/* one line; a new tuple, Py_None (borrowed, Python reads it) or NULL on error */
static PyObject *pick_line(const char *p, const char *end, const char **names,
                           const Py_ssize_t *lens, int nkeys) {
    PyObject *vals[PICK_MAX_KEYS + 3] = {NULL};   /* rank, step, t, keys... */
    int seen_kind = 0, kind_step = 0;
    unsigned long long seen = 0;
    PyObject *res = Py_None;
    while (p < end && is_ws(*p)) p++;
    if (p >= end || *p++ != '{') goto out;
    while (p < end && is_ws(*p)) p++;
    if (p < end && *p == '}') goto out;        /* {}: no kind */
    for (;;) {
        while (p < end && is_ws(*p)) p++;
        if (p >= end || *p != '"') goto out;
        const char *k = ++p;
        while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
        if (p >= end || *p != '"') goto out;
        int idx = pick_key(k, p - k, names, lens, nkeys);
        p++;
        while (p < end && is_ws(*p)) p++;
        if (p >= end || *p++ != ':') goto out;
        while (p < end && is_ws(*p)) p++;
        if (p >= end) goto out;
        if (idx != -9) {
            int bit = idx + 4;   /* -4..nkeys-1 -> 0.. */
            if (seen >> bit & 1) goto out;   /* json.loads keeps the last: Python's */
            seen |= 1ULL << bit;
        }
        char c = *p;
        if (c == '"') {
            const char *v = ++p;
            while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
            if (p >= end || *p != '"') goto out;
            if (idx == -4) {
                seen_kind = 1;
                kind_step = p - v == 4 && !memcmp(v, "step", 4);
            } else if (idx != -9) goto out;   /* a string where the agent wants a number */
            p++;
        } else if (c == 'n' && end - p >= 4 && !memcmp(p, "null", 4)) {
            if (idx >= -3 && idx < 0) goto out;   /* rank, step, t: Python's */
            if (idx == -4) goto out;
            p += 4;
        } else if ((c == 't' && end - p >= 4 && !memcmp(p, "true", 4)) ||
                   (c == 'f' && end - p >= 5 && !memcmp(p, "false", 5))) {
            if (idx != -9) goto out;
            p += c == 't' ? 4 : 5;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            int fl;
            const char *q = pick_number(p, end, &fl);
            if (!q) goto out;
            if (idx == -4) goto out;
            if (idx != -9) {
                if ((idx == -1 || idx == -2) && fl) goto out;
                PyObject *o = pick_obj(p, q, fl);
                if (!o) {
                    if (PyErr_Occurred()) res = NULL;
                    goto out;
                }
                int slot = idx == -1 ? 0 : idx == -2 ? 1 : idx == -3 ? 2 : idx + 3;
                vals[slot] = o;
            }
            p = q;
        } else goto out;   /* nested values, NaN, Infinity: Python's */
        while (p < end && is_ws(*p)) p++;
        if (p >= end) goto out;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p != '}') goto out;
        p++;
        break;
    }
    while (p < end && is_ws(*p)) p++;
    if (p != end || !seen_kind || !kind_step || !vals[0] || !vals[1] || !vals[2]) goto out;
    if (PyLong_AsLongLong(vals[1]) < 0) {   /* a negative step (or a huge one): Python's */
        PyErr_Clear();
        goto out;
    }
    if (PyLong_AsLongLong(vals[0]) == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        goto out;
    }
    res = PyTuple_New(nkeys + 4);
    if (!res) goto out;
    for (int i = 0; i < nkeys + 3; i++) {
        PyObject *o = vals[i] ? vals[i] : Py_None;
        if (!vals[i]) Py_INCREF(Py_None);
        vals[i] = NULL;
        PyTuple_SET_ITEM(res, i, o);
    }
    PyObject *had = (seen >> 4 & 1) ? Py_True : Py_False;
    Py_INCREF(had);
    PyTuple_SET_ITEM(res, nkeys + 3, had);
out:
    for (int i = 0; i < nkeys + 3; i++) Py_XDECREF(vals[i]);
    return res;
}

static PyObject *py_pick_steps(PyObject *self, PyObject *args) {
    PyObject *lines, *keys;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &lines, &PyTuple_Type, &keys)) return NULL;
    int nkeys = (int)PyTuple_GET_SIZE(keys);
    if (nkeys > PICK_MAX_KEYS) {
        PyErr_SetString(PyExc_ValueError, "too many keys");
        return NULL;
    }
    const char *names[PICK_MAX_KEYS];
    Py_ssize_t lens[PICK_MAX_KEYS];
    for (int i = 0; i < nkeys; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        if (!PyUnicode_Check(k) || !(names[i] = PyUnicode_AsUTF8AndSize(k, &lens[i]))) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "keys must be str");
            return NULL;
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(lines);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ln = PyList_GET_ITEM(lines, i), *r = Py_None;
        Py_ssize_t len;
        const char *p;
        if (PyUnicode_Check(ln) && (p = PyUnicode_AsUTF8AndSize(ln, &len))) {
            r = pick_line(p, p + len, names, lens, nkeys);
            if (!r) {
                Py_DECREF(out);
                return NULL;
            }
            if (r == Py_None) Py_INCREF(r);
        } else {
            PyErr_Clear();
            Py_INCREF(r);
        }
        PyList_SET_ITEM(out, i, r);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"matcher", py_matcher, METH_VARARGS, "matcher(report_tokens, fact_tokens) -> capsule"},
    {"classify", py_classify, METH_VARARGS,
     "classify(matcher, buf, pos, end) -> (stop, lines, heads, transports, facts, hint, other)"},
    {"dict_records", py_dict_records, METH_VARARGS,
     "dict_records(buf, pos, end, max_steps, bar_step) -> "
     "(stop, n, steps, values, present, ints, order, ascending, max_steps, bar_step)"},
    {"rows", py_rows, METH_VARARGS,
     "rows(steps, values, present, ints, order, rank, start, stop) -> [dict, ...]"},
    {"pick_steps", py_pick_steps, METH_VARARGS,
     "pick_steps(lines, keys) -> [None | (rank, step, t, *values, has_first_key), ...]"},
    {"float_text", py_float_text, METH_VARARGS,
     "float_text(x, fast_only=False) -> repr(x) (None with fast_only when unsure)"},
    {"step_text", py_step_text, METH_VARARGS,
     "step_text(rows, start, stop_step, rank, need_max_steps) -> (text, next)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastscan(void) {
    if (key_table_init() < 0) {
        PyErr_SetString(PyExc_RuntimeError, "key table overflow");
        return NULL;
    }
    strtod_ok = strtod("1.5", NULL) == 1.5 && strtod("2.5e-3", NULL) == 0.0025;
    for (int i = 0; i < NV; i++)
        if (!(ckeys[i] = PyUnicode_InternFromString(cnames[i]))) return NULL;
    if (!(key_step = PyUnicode_InternFromString("step")) ||
        !(key_rank = PyUnicode_InternFromString("rank")))
        return NULL;
    return PyModule_Create(&module);
}
