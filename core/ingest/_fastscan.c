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
 * A line is Python's when it holds a report token, a byte >= 0x80, a line-leading '{', or
 * `NCCL INFO` anywhere but in the plain head shape, or a fact token outside an NCCL INFO line,
 * or a `via` that is not in the channel shape.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
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

static PyMethodDef methods[] = {
    {"matcher", py_matcher, METH_VARARGS, "matcher(report_tokens, fact_tokens) -> capsule"},
    {"classify", py_classify, METH_VARARGS,
     "classify(matcher, buf, pos, end) -> (stop, lines, heads, transports, facts, hint, other)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastscan(void) { return PyModule_Create(&module); }
