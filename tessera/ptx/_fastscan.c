/* The accelerated path of tessera/ptx (fast.py is its one Python interface; the PyYAML CLoader pattern:
 * same results as the pure-Python reference path, which runs wherever this is not built).
 * `Scanner(lines, scopes, prefix_table, kinds, transfers, sites, site_addrs, entry_params, fparams, decls,
 * first_line)` iterates an enumerate of a body's lines: every line whose prefix (its text up to the first
 * space) fast.py has learnt from an earlier line, and whose operands have one of the plain shapes below, it
 * lowers here (appending transfers and sites equivalent to lower.py's); every other line it yields as
 * (k, raw) for the reference reader (body.BodyReader) and lowering. It never learns prefixes, never reads
 * lines while a brace scope is open (`scopes` non-empty: renaming), and handles ASCII lines only.
 * tests/ptx/test_ptx_differential.py holds both paths to equal results. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* fast.py checks these against its own constants (LAYOUT) before using the module */
enum { K_COPY, K_SCALE, K_SHL, K_LD, K_ST, K_CVTA, K_MAD, K_CP_NOP, K_CALL, K_OTHER, K_IGNORE };
enum { K_GUARD = 100, K_REG, K_SKIPDIR, K_BLANK };
enum { T_COPY = 0, T_MAD = 2, T_SHL_HI = 4, T_LOAD = 6, T_SCALE1 = 10 };
enum { S_GLOBAL, S_LOCAL, S_PARAM, S_GENERIC };
enum { ACC_R = 1, ACC_W = 2 };
#define MAX_OPS 32

typedef const unsigned char *str_t;

static PyObject *MEM_T, *LOCAL_T, *PARAM_S, *EQ_S; /* ("<mem>",), ("<local>",), ".param", "=" */

static inline int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static inline int is_digit(int c) { return c >= '0' && c <= '9'; }
static inline int is_w(int c) { return is_alpha(c) || is_digit(c) || c == '_'; }
static inline int is_na0(int c) { return is_alpha(c) || c == '_' || c == '$' || c == '%'; }
static inline int is_na(int c) { return is_w(c) || c == '$' || c == '@'; }
static inline int is_blank(int c) { return c == ' ' || c == '\t'; }

static Py_ssize_t blanks(str_t s, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && is_blank(s[i])) i++;
    return i;
}

/* NA = [A-Za-z_$%][\w$@]*+ ; end or -1 */
static Py_ssize_t na(str_t s, Py_ssize_t i, Py_ssize_t n) {
    if (i >= n || !is_na0(s[i])) return -1;
    for (i++; i < n && is_na(s[i]); i++) {}
    return i;
}

/* NA | -?\d\w*+ */
static Py_ssize_t na_or_num(str_t s, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t j = na(s, i, n);
    if (j >= 0) return j;
    if (i < n && s[i] == '-') i++;
    if (i >= n || !is_digit(s[i])) return -1;
    for (i++; i < n && is_w(s[i]); i++) {}
    return i;
}

/* NA(?:, (?:NA|num))*+ from i: the number of operands (spans in sp) and their end, 0 when none, -1
 * when more than MAX_OPS */
static int arith(str_t s, Py_ssize_t i, Py_ssize_t n, Py_ssize_t sp[][2], Py_ssize_t *end) {
    Py_ssize_t j = na(s, i, n);
    if (j < 0) return 0;
    int c = 0;
    sp[c][0] = i; sp[c][1] = j; c++;
    while (j + 1 < n && s[j] == ',' && s[j + 1] == ' ') {
        Py_ssize_t k = na_or_num(s, j + 2, n);
        if (k < 0) break;
        if (c == MAX_OPS) return -1;
        sp[c][0] = j + 2; sp[c][1] = k; c++;
        j = k;
    }
    *end = j;
    return c;
}

static inline int ends_stmt(str_t s, Py_ssize_t i, Py_ssize_t n) { return i == n - 1 && s[i] == ';'; }

/* post.find(";") == len(post) - 1 >= 0 */
static int one_stmt(str_t s, Py_ssize_t n) {
    if (n == 0) return 0;
    const void *p = memchr(s, ';', (size_t)n);
    return p == (const void *)(s + n - 1);
}

static PyObject *sub(PyObject *u, Py_ssize_t a, Py_ssize_t b) { return PyUnicode_Substring(u, a, b); }

static PyObject *span_list(PyObject *u, Py_ssize_t off, Py_ssize_t sp[][2], int a, int b) {
    PyObject *l = PyList_New(b - a);
    if (l == NULL) return NULL;
    for (int i = a; i < b; i++) {
        PyObject *t = sub(u, off + sp[i][0], off + sp[i][1]);
        if (t == NULL) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, i - a, t);
    }
    return l;
}

/* _TOK.findall over s[a:b] as a list: (?<![\w$.%@])[A-Za-z_$%][\w$@]*, lookbehind within the slice */
static PyObject *toks(PyObject *u, str_t s, Py_ssize_t a, Py_ssize_t b) {
    PyObject *l = PyList_New(0);
    if (l == NULL) return NULL;
    Py_ssize_t i = a;
    while (i < b) {
        int c = s[i];
        if (is_na0(c) && (i == a || !(is_w(s[i - 1]) || s[i - 1] == '$' || s[i - 1] == '.' ||
                                      s[i - 1] == '%' || s[i - 1] == '@'))) {
            Py_ssize_t j = i + 1;
            while (j < b && is_na(s[j])) j++;
            PyObject *t = sub(u, i, j);
            if (t == NULL || PyList_Append(l, t) < 0) { Py_XDECREF(t); Py_DECREF(l); return NULL; }
            Py_DECREF(t);
            i = j;
        } else {
            i++;
        }
    }
    return l;
}

/* [ \t]*+ NA [ \t]*+ (?:\+[ \t]*+-?\d++[ \t]*+)? \]  from i (just past "["): end past "]" or -1 */
static Py_ssize_t address(str_t s, Py_ssize_t i, Py_ssize_t n, Py_ssize_t *b0, Py_ssize_t *b1) {
    i = blanks(s, i, n);
    Py_ssize_t j = na(s, i, n);
    if (j < 0) return -1;
    *b0 = i; *b1 = j;
    i = blanks(s, j, n);
    if (i < n && s[i] == '+') {
        i = blanks(s, i + 1, n);
        if (i < n && s[i] == '-') i++;
        if (i >= n || !is_digit(s[i])) return -1;
        while (i < n && is_digit(s[i])) i++;
        i = blanks(s, i, n);
    }
    if (i >= n || s[i] != ']') return -1;
    return i + 1;
}

typedef struct {
    PyObject_HEAD
    PyObject *lines, *scopes, *raw, *kinds, *transfers, *sites, *site_addrs, *entry_params, *fparams, *decls;
    Py_ssize_t first_line;
} Scanner;

static int append_steal(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* base in entry_params or base in fparams or decls.get(base) == ".param" */
static int is_param(Scanner *sc, PyObject *base) {
    int r = PySequence_Contains(sc->entry_params, base);
    if (r != 0) return r;
    r = PySequence_Contains(sc->fparams, base);
    if (r != 0) return r;
    PyObject *v = PyDict_GetItemWithError(sc->decls, base);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(v); /* borrowed from decls, which the comparison's Python code may change */
    r = PyObject_RichCompareBool(v, PARAM_S, Py_EQ);
    Py_DECREF(v);
    return r;
}

static PyObject *site(Scanner *sc, int acc, Py_ssize_t k, PyObject *op, PyObject *addr) {
    Py_ssize_t idx = PyList_GET_SIZE(sc->sites);
    if (append_steal(sc->site_addrs, Py_BuildValue("(nO)", idx, addr)) < 0) return NULL;
    if (append_steal(sc->sites, Py_BuildValue("(inO)", acc, sc->first_line + k, op)) < 0) return NULL;
    return Py_None;
}

static int settle_op(Scanner *sc, Py_ssize_t k, PyObject *u, str_t s, Py_ssize_t n, Py_ssize_t p, long kind,
                     PyObject *detail, PyObject *op);

/* One line: 1 settled (transfers appended), 0 the Python loop must read it, -1 error. `u`/`s`/`n`:
 * the raw line. */
static int settle_entry(Scanner *sc, Py_ssize_t k, PyObject *u, str_t s, Py_ssize_t n, Py_ssize_t sp0,
                        PyObject *h);

static int settle(Scanner *sc, Py_ssize_t k, PyObject *u, str_t s, Py_ssize_t n) {
    Py_ssize_t sp0 = -1;
    const unsigned char *q = memchr(s, ' ', (size_t)n);
    if (q != NULL) sp0 = q - s;
    PyObject *pre = sp0 < 0 ? (Py_INCREF(u), u) : sub(u, 0, sp0);
    if (pre == NULL) return -1;
    PyObject *h = PyDict_GetItemWithError(sc->raw, pre); /* borrowed */
    Py_DECREF(pre);
    if (h == NULL) {
        if (PyErr_Occurred()) return -1;
        /* a label in column 0: _LABEL = [A-Za-z_$%][\w$]*:\Z */
        if (n < 2 || s[n - 1] != ':' || !is_na0(s[0])) return 0;
        for (Py_ssize_t i = 1; i < n - 1; i++)
            if (!is_w(s[i]) && s[i] != '$') return 0;
        return 1;
    }
    Py_INCREF(h); /* the prefix table's entry, held while this line's work may run Python code */
    int r = settle_entry(sc, k, u, s, n, sp0, h);
    Py_DECREF(h);
    return r;
}

static int settle_entry(Scanner *sc, Py_ssize_t k, PyObject *u, str_t s, Py_ssize_t n, Py_ssize_t sp0,
                        PyObject *h) {
    if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) < 5) return 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(h, 0));
    if (kind == -1 && PyErr_Occurred()) return -1;
    PyObject *detail = PyTuple_GET_ITEM(h, 1), *op = PyTuple_GET_ITEM(h, 4);
    Py_ssize_t p = sp0 < 0 ? n : sp0 + 1; /* post = s[p:n] */
    int sep = sp0 >= 0;
    if (kind >= K_IGNORE) {
        /* a prefix ending in ";" is a whole line fast.py learnt ("\tret;"): this line is that statement
         * and another ("\tret; st.global.f32 [%rd4], %f2;"), which the reference reader must read */
        if (kind == K_IGNORE)
            return sep ? sp0 > 0 && s[sp0 - 1] != ';' && one_stmt(s + p, n - p) : s[n - 1] == ';';
        if (kind == K_SKIPDIR)
            return memchr(s, ';', (size_t)n) == NULL;
        if (kind == K_REG)
            return sep && one_stmt(s + p, n - p);
        if (kind == K_BLANK)
            return !sep;
        if (kind != K_GUARD || !sep || !one_stmt(s + p, n - p))
            return 0;
        /* line = post.lstrip(); op, sep, post = line.partition(" "); h = _KINDS.get(op) */
        Py_ssize_t a = p;
        while (a < n && (is_blank(s[a]) || (s[a] >= 10 && s[a] <= 13) || (s[a] >= 28 && s[a] <= 31))) a++;
        const unsigned char *q2 = memchr(s + a, ' ', (size_t)(n - a));
        if (q2 == NULL) return 0;
        Py_ssize_t e = q2 - s;
        PyObject *gop = sub(u, a, e);
        if (gop == NULL) return -1;
        PyObject *h2 = PyDict_GetItemWithError(sc->kinds, gop);
        if (h2 == NULL || !PyTuple_Check(h2) || PyTuple_GET_SIZE(h2) < 2) {
            Py_DECREF(gop);
            return PyErr_Occurred() ? -1 : 0;
        }
        Py_INCREF(h2); /* the kinds table's entry (its detail is read below), held as settle holds h */
        kind = PyLong_AsLong(PyTuple_GET_ITEM(h2, 0));
        int r = kind == -1 && PyErr_Occurred() ? -1 : 1;
        if (r == 1 && kind != K_IGNORE)
            /* the guarded statement, settled with its own opcode string as the sites' opcode */
            r = settle_op(sc, k, u, s, n, e + 1, kind, PyTuple_GET_ITEM(h2, 1), gop);
        Py_DECREF(h2);
        Py_DECREF(gop);
        return r;
    }
    if (!sep) return 0;
    return settle_op(sc, k, u, s, n, p, kind, detail, op);
}

/* The statement's operands s[p:n] ("post") by its fast kind; as settle. */
static int settle_op(Scanner *sc, Py_ssize_t k, PyObject *u, str_t s, Py_ssize_t n, Py_ssize_t p, long kind,
                     PyObject *detail, PyObject *op) {
    Py_ssize_t sp[MAX_OPS][2], end = 0;
    str_t t = s + p;
    Py_ssize_t m = n - p;
    Py_ssize_t i0 = blanks(t, 0, m);
    if (kind <= K_SHL) {
        int c = arith(t, i0, m, sp, &end);
        if (c < 0) return 0;
        if (c > 0 && ends_stmt(t, end, m)) {
            PyObject *ops = span_list(u, p, sp, 0, c);
            if (ops == NULL) return -1;
            if (kind == K_COPY) return append_steal(sc->transfers, ops) < 0 ? -1 : 1;
            if (kind == K_SHL) {
                /* ops[-1].isdecimal() and int(ops[-1]) >= 32 */
                Py_ssize_t a = sp[c - 1][0], b = sp[c - 1][1], d = a;
                while (d < b && is_digit(t[d])) d++;
                if (d == b) {
                    while (a < b - 1 && t[a] == '0') a++;
                    long v = 0;
                    if (b - a > 2) v = 100;
                    else for (; a < b; a++) v = v * 10 + (t[a] - '0');
                    if (v >= 32) {
                        PyObject *l = PyList_GetSlice(ops, 0, 1), *r = PyList_GetSlice(ops, 1, c);
                        Py_DECREF(ops);
                        if (l == NULL || r == NULL) { Py_XDECREF(l); Py_XDECREF(r); return -1; }
                        return append_steal(sc->transfers, Py_BuildValue("(iNN)", T_SHL_HI, l, r)) < 0 ? -1 : 1;
                    }
                }
            }
            return append_steal(sc->transfers, Py_BuildValue("(iN)", T_SCALE1, ops)) < 0 ? -1 : 1;
        }
        /* (NA), (NA)\.\w++;  a special register: "%r3, %ctaid.x" */
        Py_ssize_t j = na(t, i0, m);
        if (j >= 0 && j + 1 < m && t[j] == ',' && t[j + 1] == ' ') {
            Py_ssize_t k2 = na(t, j + 2, m);
            if (k2 >= 0 && k2 + 1 < m && t[k2] == '.' && is_w(t[k2 + 1])) {
                Py_ssize_t e = k2 + 1;
                while (e < m && is_w(t[e])) e++;
                if (ends_stmt(t, e, m)) {
                    sp[0][0] = i0; sp[0][1] = j; sp[1][0] = j + 2; sp[1][1] = k2;
                    PyObject *ops = span_list(u, p, sp, 0, 2);
                    if (ops == NULL) return -1;
                    if (kind == K_COPY) return append_steal(sc->transfers, ops) < 0 ? -1 : 1;
                    return append_steal(sc->transfers, Py_BuildValue("(iN)", T_SCALE1, ops)) < 0 ? -1 : 1;
                }
            }
        }
        if (kind != K_COPY) return 0;
        /* (NA)\|(NA), (arith);  shfl's "%r9|%p1, %r8, 16, 31, -1" */
        if (j < 0 || j >= m || t[j] != '|') return 0;
        Py_ssize_t j2 = na(t, j + 1, m);
        if (j2 < 0 || j2 + 1 >= m || t[j2] != ',' || t[j2 + 1] != ' ') return 0;
        c = arith(t, j2 + 2, m, sp, &end);
        if (c <= 0 || !ends_stmt(t, end, m)) return 0;
        PyObject *a = sub(u, p + i0, p + j), *b = sub(u, p + j + 1, p + j2);
        PyObject *rest = span_list(u, p, sp, 0, c);
        if (a == NULL || b == NULL || rest == NULL) { Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(rest); return -1; }
        return append_steal(sc->transfers, Py_BuildValue("(i(NN)N)", T_COPY, a, b, rest)) < 0 ? -1 : 1;
    }
    if (kind == K_LD) {
        /* (NA | \{[\w$@%, \t]*+\}) [ \t]*+ , [ \t]*+ \[ address ; */
        Py_ssize_t d0 = i0, d1, b0, b1;
        int brace = d0 < m && t[d0] == '{';
        if (brace) {
            d1 = d0 + 1;
            while (d1 < m && (is_w(t[d1]) || t[d1] == '$' || t[d1] == '@' || t[d1] == '%' || t[d1] == ','
                              || is_blank(t[d1]))) d1++;
            if (d1 >= m || t[d1] != '}') return 0;
            d1++;
        } else if ((d1 = na(t, d0, m)) < 0) {
            return 0;
        }
        Py_ssize_t i = blanks(t, d1, m);
        if (i >= m || t[i] != ',') return 0;
        i = blanks(t, i + 1, m);
        if (i >= m || t[i] != '[') return 0;
        i = address(t, i + 1, m, &b0, &b1);
        if (i < 0) return 0;
        if (!ends_stmt(t, blanks(t, i, m), m)) return 0;
        if (!PyTuple_Check(detail) || PyTuple_GET_SIZE(detail) != 3) return 0;
        PyObject *space_o = PyTuple_GET_ITEM(detail, 0), *wide_o = PyTuple_GET_ITEM(detail, 1);
        int is_site = PyObject_IsTrue(PyTuple_GET_ITEM(detail, 2));
        long space = PyLong_AsLong(space_o);
        if (is_site < 0 || (space == -1 && PyErr_Occurred())) return -1;
        PyObject *dst;
        if (brace) {
            PyObject *l = toks(u, s, p + d0, p + d1);
            if (l == NULL) return -1;
            dst = PyList_AsTuple(l);
            Py_DECREF(l);
        } else {
            dst = PyTuple_New(1);
            if (dst != NULL) {
                PyObject *x = sub(u, p + d0, p + d1);
                if (x == NULL) { Py_DECREF(dst); return -1; }
                PyTuple_SET_ITEM(dst, 0, x);
            }
        }
        PyObject *base = sub(u, p + b0, p + b1);
        if (dst == NULL || base == NULL) { Py_XDECREF(dst); Py_XDECREF(base); return -1; }
        if (space == S_PARAM) {
            int r = is_param(sc, base);
            if (r < 0) { Py_DECREF(dst); Py_DECREF(base); return -1; }
            if (r) {
                PyObject *content = PyUnicode_Concat(EQ_S, base);
                Py_DECREF(base);
                if (content == NULL) { Py_DECREF(dst); return -1; }
                return append_steal(sc->transfers, Py_BuildValue("(iN(N))", T_COPY, dst, content)) < 0 ? -1 : 1;
            }
        }
        PyObject *addr = PyTuple_Pack(1, base);
        Py_DECREF(base);
        if (addr == NULL) { Py_DECREF(dst); return -1; }
        if (append_steal(sc->transfers, Py_BuildValue("(iNOOO)", T_LOAD, dst, addr, space_o, wide_o)) < 0) {
            Py_DECREF(addr);
            return -1;
        }
        PyObject *r = is_site ? site(sc, ACC_R, k, op, addr) : Py_None;
        Py_DECREF(addr);
        return r == NULL ? -1 : 1;
    }
    if (kind == K_ST) {
        /* \[ address [ \t]*+ , [ \t]*+ ([^,\[\]{}()|;\n]+ | \{[^{}\[\]();\n]*+\}) [ \t]*+ ; */
        Py_ssize_t b0, b1, i = i0;
        if (i >= m || t[i] != '[') return 0;
        i = address(t, i + 1, m, &b0, &b1);
        if (i < 0) return 0;
        i = blanks(t, i, m);
        if (i >= m || t[i] != ',') return 0;
        Py_ssize_t a = blanks(t, i + 1, m), e = a;
        if (a < m && t[a] == '{') {
            for (e = a + 1; e < m && !strchr("{}[]();\n", t[e]); e++) {}
            if (e >= m || t[e] != '}') return 0;
            e++;
            if (!ends_stmt(t, blanks(t, e, m), m)) return 0;
        } else {
            while (e < m && !strchr(",[]{}()|;\n", t[e])) e++;
            if (e == a || !ends_stmt(t, e, m)) return 0;
        }
        long space = PyLong_AsLong(detail);
        if (space == -1 && PyErr_Occurred()) return -1;
        PyObject *srcs = toks(u, s, p + a, p + e);
        PyObject *base = sub(u, p + b0, p + b1);
        if (srcs == NULL || base == NULL) { Py_XDECREF(srcs); Py_XDECREF(base); return -1; }
        if (space == S_PARAM) {
            int r = is_param(sc, base);
            if (r <= 0) { Py_DECREF(srcs); Py_DECREF(base); return r < 0 ? -1 : 1; }
            PyObject *content = PyUnicode_Concat(EQ_S, base);
            Py_DECREF(base);
            if (content == NULL) { Py_DECREF(srcs); return -1; }
            return append_steal(sc->transfers, Py_BuildValue("(i(N)N)", T_COPY, content, srcs)) < 0 ? -1 : 1;
        }
        if (space != S_GLOBAL) {
            if (append_steal(sc->transfers, Py_BuildValue("(iON)", T_COPY, MEM_T, srcs)) < 0) {
                Py_DECREF(base);
                return -1;
            }
        } else {
            Py_DECREF(srcs);
        }
        if (space == S_GLOBAL || space == S_GENERIC) {
            PyObject *addr = PyTuple_Pack(1, base);
            Py_DECREF(base);
            if (addr == NULL) return -1;
            PyObject *r = site(sc, ACC_W, k, op, addr);
            Py_DECREF(addr);
            return r == NULL ? -1 : 1;
        }
        Py_DECREF(base);
        return 1;
    }
    if (kind == K_CVTA || kind == K_MAD) {
        int c = arith(t, i0, m, sp, &end);
        if (c <= 0 || !ends_stmt(t, end, m)) return 0;
        if (kind == K_CVTA) {
            int local = PyObject_IsTrue(detail);
            if (local < 0) return -1;
            PyObject *d = span_list(u, p, sp, 0, 1);
            PyObject *r = local ? (Py_INCREF(LOCAL_T), LOCAL_T) : span_list(u, p, sp, 1, c);
            if (d == NULL || r == NULL) { Py_XDECREF(d); Py_XDECREF(r); return -1; }
            return append_steal(sc->transfers, Py_BuildValue("(iNN)", T_COPY, d, r)) < 0 ? -1 : 1;
        }
        if (c != 4) return 0;
        PyObject *d = span_list(u, p, sp, 0, 1), *ab = span_list(u, p, sp, 1, 3), *cc = span_list(u, p, sp, 3, 4);
        if (d == NULL || ab == NULL || cc == NULL) { Py_XDECREF(d); Py_XDECREF(ab); Py_XDECREF(cc); return -1; }
        return append_steal(sc->transfers, Py_BuildValue("(iNNN)", T_MAD, d, ab, cc)) < 0 ? -1 : 1;
    }
    if (kind == K_CP_NOP) {
        if (!one_stmt(t, m)) return 0;
        for (Py_ssize_t i = 0; i < m - 1; i++)
            if (strchr(",[{(]})", t[i]) && t[i] != 0) return 0;
        return 1;
    }
    return 0;
}

static PyObject *scanner_next(Scanner *sc) {
    for (;;) {
        PyObject *item = PyIter_Next(sc->lines);
        if (item == NULL) return NULL; /* exhausted, or the error PyIter_Next set */
        if (PyList_GET_SIZE(sc->scopes) != 0 || !PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
            return item;
        PyObject *u = PyTuple_GET_ITEM(item, 1);
        if (!PyUnicode_Check(u) || !PyUnicode_IS_ASCII(u)) return item;
        Py_ssize_t n = PyUnicode_GET_LENGTH(u);
        if (n == 0) { Py_DECREF(item); continue; }
        Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        if (k == -1 && PyErr_Occurred()) { Py_DECREF(item); return NULL; }
        int r = settle(sc, k, u, (str_t)PyUnicode_1BYTE_DATA(u), n);
        if (r < 0) { Py_DECREF(item); return NULL; }
        if (r == 0) return item;
        Py_DECREF(item);
    }
}

static void scanner_dealloc(Scanner *sc) {
    Py_XDECREF(sc->lines); Py_XDECREF(sc->scopes); Py_XDECREF(sc->raw); Py_XDECREF(sc->kinds);
    Py_XDECREF(sc->transfers); Py_XDECREF(sc->sites); Py_XDECREF(sc->site_addrs);
    Py_XDECREF(sc->entry_params); Py_XDECREF(sc->fparams); Py_XDECREF(sc->decls);
    Py_TYPE(sc)->tp_free((PyObject *)sc);
}

static PyObject *scanner_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *o[10];
    Py_ssize_t first_line;
    if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
        PyErr_SetString(PyExc_TypeError, "Scanner() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!O!O!OO!n:Scanner", &o[0], &PyList_Type, &o[1], &PyDict_Type, &o[2],
                          &PyDict_Type, &o[3], &PyList_Type, &o[4], &PyList_Type, &o[5], &PyList_Type, &o[6],
                          &PyDict_Type, &o[7], &o[8], &PyDict_Type, &o[9], &first_line))
        return NULL;
    /* PyIter_Next calls tp_iternext unchecked: an iterator (for one, the same object, shared with fast.py) */
    PyObject *lines = PyObject_GetIter(o[0]);
    if (lines == NULL) return NULL;
    Scanner *sc = (Scanner *)type->tp_alloc(type, 0);
    if (sc == NULL) { Py_DECREF(lines); return NULL; }
    o[0] = lines;
    PyObject **f[10] = {&sc->lines, &sc->scopes, &sc->raw, &sc->kinds, &sc->transfers, &sc->sites,
                        &sc->site_addrs, &sc->entry_params, &sc->fparams, &sc->decls};
    for (int i = 1; i < 10; i++) Py_INCREF(o[i]);
    for (int i = 0; i < 10; i++) *f[i] = o[i]; /* lines: the reference PyObject_GetIter gave */
    sc->first_line = first_line;
    return (PyObject *)sc;
}

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tessera.ptx._fastscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Settles a body's common lines; yields the others as (k, raw).",
    .tp_new = scanner_new,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)scanner_next,
};

/* ---- the dataflow's first pass over bit sets (Python ints), the transfers it reads most ------------
 * first_pass(ctx, transfers, vals, amask, a0, p0, load, call, transfer) is _first_pass exactly: COPY1
 * lists, SCALE1, COPY and global LOADs here; other loads, calls and the rare codes through the Python
 * functions it is given (_load, _call, _transfer). `vals` is the defaultdict(int): a read of a missing
 * name inserts 0 as defaultdict does, `.get` does not; the early-stop proof depends on which. */
enum { E_DATA = 2, E_COPY = 0, E_LOAD = 6, E_CALL = 8, E_SCALE1 = 10 };
static PyObject *ZERO, *DATA_O;

/* vals[s] (new reference) */
static PyObject *get0(PyObject *vals, PyObject *s) {
    PyObject *v = PyDict_GetItemWithError(vals, s);
    if (v != NULL) { Py_INCREF(v); return v; }
    if (PyErr_Occurred() || PyDict_SetItem(vals, s, ZERO) < 0) return NULL;
    Py_INCREF(ZERO);
    return ZERO;
}

/* OR of vals[s] for s in seq (a list or tuple of names); new reference */
static PyObject *or_all(PyObject *vals, PyObject *seq) {
    PyObject *fast = PySequence_Fast(seq, "transfer sources must be a list or tuple");
    if (fast == NULL) return NULL;
    PyObject *acc = ZERO;
    Py_INCREF(acc);
    /* size and item re-read, the item held: a name's __hash__/__eq__ may change a list `fast` is */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(fast, i);
        Py_INCREF(s);
        PyObject *x = get0(vals, s);
        Py_DECREF(s);
        if (x == NULL) { Py_DECREF(acc); acc = NULL; break; }
        if (acc == ZERO) { Py_DECREF(acc); acc = x; continue; }
        PyObject *y = PyNumber_Or(acc, x);
        Py_DECREF(acc);
        Py_DECREF(x);
        acc = y;
        if (acc == NULL) break;
    }
    Py_DECREF(fast);
    return acc;
}

/* vals[d] = old | v when that grows it; 1 grown, 0 not, -1 error */
static int join(PyObject *vals, PyObject *d, PyObject *old, PyObject *v) {
    PyObject *nv = PyNumber_Or(old, v);
    if (nv == NULL) return -1;
    int ne = PyObject_RichCompareBool(nv, old, Py_NE);
    int r = ne <= 0 ? ne : (PyDict_SetItem(vals, d, nv) < 0 ? -1 : 1);
    Py_DECREF(nv);
    return r;
}

static int step(PyObject *t, PyObject *ctx, PyObject *vals, PyObject *amask, PyObject *a0, PyObject *p0,
                PyObject *load, PyObject *call, PyObject *transfer) {
    if (PyList_CheckExact(t)) { /* COPY1 [d, sources...]: includes d's own value */
        if (PyList_GET_SIZE(t) == 0) { PyErr_SetString(PyExc_AssertionError, "empty COPY1"); return -1; }
        PyObject *d = PyList_GET_ITEM(t, 0);
        Py_INCREF(d);
        PyObject *old = PyDict_GetItemWithError(vals, d);
        int r = 0;
        if (old != NULL) {
            Py_INCREF(old);
            PyObject *v = or_all(vals, t);
            if (v == NULL) r = -1;
            else {
                int ne = PyObject_RichCompareBool(v, old, Py_NE);
                r = ne <= 0 ? ne : (PyDict_SetItem(vals, d, v) < 0 ? -1 : 1);
                Py_DECREF(v);
            }
            Py_DECREF(old);
        } else if (PyErr_Occurred() || PyDict_SetItem(vals, d, ZERO) < 0) {
            r = -1;
        } else { /* absent: a first assignment, never a reason for another pass */
            PyObject *v = or_all(vals, t);
            if (v == NULL) r = -1;
            else {
                int truth = PyObject_IsTrue(v);
                r = truth < 0 ? -1 : (truth && PyDict_SetItem(vals, d, v) < 0 ? -1 : 0);
                Py_DECREF(v);
            }
        }
        Py_DECREF(d);
        return r;
    }
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) < 2) {
        PyErr_SetString(PyExc_AssertionError, "malformed transfer");
        return -1;
    }
    PyObject *code_o = PyTuple_GET_ITEM(t, 0);
    long code = PyLong_AsLong(code_o);
    if (code == -1 && PyErr_Occurred()) return -1;
    PyObject *v;
    if (code == E_SCALE1) {
        PyObject *ops = PyTuple_GET_ITEM(t, 1);
        if (!PyList_Check(ops) || PyList_GET_SIZE(ops) == 0) {
            PyErr_SetString(PyExc_AssertionError, "malformed SCALE1");
            return -1;
        }
        PyObject *d = PyList_GET_ITEM(ops, 0);
        Py_INCREF(d);
        int present = PyDict_Contains(vals, d);
        PyObject *w = present < 0 ? NULL : or_all(vals, ops);
        v = w == NULL ? NULL : PyNumber_And(w, DATA_O);
        Py_XDECREF(w);
        int r = v == NULL ? -1 : PyObject_IsTrue(v);
        if (r > 0) {
            PyObject *old = get0(vals, d);
            r = old == NULL ? -1 : join(vals, d, old, v);
            Py_XDECREF(old);
            if (r > 0 && present == 0) r = 0; /* absent before: a first assignment */
        }
        Py_XDECREF(v);
        Py_DECREF(d);
        return r;
    }
    if (code == E_COPY) {
        if (PyTuple_GET_SIZE(t) < 3) { PyErr_SetString(PyExc_AssertionError, "malformed COPY"); return -1; }
        v = or_all(vals, PyTuple_GET_ITEM(t, 2));
    } else if (code == E_LOAD) {
        if (PyTuple_GET_SIZE(t) < 5) { PyErr_SetString(PyExc_AssertionError, "malformed LOAD"); return -1; }
        long space = PyLong_AsLong(PyTuple_GET_ITEM(t, 3));
        if (space == -1 && PyErr_Occurred()) return -1;
        if (space == S_GLOBAL) {
            v = PyNumber_Or(DATA_O, PyTuple_GET_ITEM(t, 4));
        } else {
            PyObject *w = or_all(vals, PyTuple_GET_ITEM(t, 2));
            v = w == NULL ? NULL : PyObject_CallFunctionObjArgs(load, t, w, vals, amask, a0, p0, NULL);
            Py_XDECREF(w);
        }
    } else if (code == E_CALL) {
        PyObject *r = PyObject_CallFunctionObjArgs(call, ctx, t, vals, Py_True, NULL);
        if (r == NULL) return -1;
        int truth = PyObject_IsTrue(r);
        Py_DECREF(r);
        return truth;
    } else {
        v = PyObject_CallFunctionObjArgs(transfer, t, code_o, vals, amask, a0, p0, NULL);
    }
    if (v == NULL) return -1;
    int truth = PyObject_IsTrue(v);
    if (truth <= 0) { Py_DECREF(v); return truth; }
    PyObject *dsts = PySequence_Fast(PyTuple_GET_ITEM(t, 1), "transfer destinations must be a list or tuple");
    if (dsts == NULL) { Py_DECREF(v); return -1; }
    int again = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(dsts); i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(dsts, i);
        Py_INCREF(d); /* as in or_all: its hash may run Python code that changes the list */
        PyObject *old = PyDict_GetItemWithError(vals, d); /* vals.get(d): no insertion */
        int r;
        if (old == NULL)
            r = PyErr_Occurred() || PyDict_SetItem(vals, d, v) < 0 ? -1 : 0;
        else {
            Py_INCREF(old);
            r = join(vals, d, old, v);
            Py_DECREF(old);
        }
        Py_DECREF(d);
        if (r < 0) { again = -1; break; }
        again |= r;
    }
    Py_DECREF(dsts);
    Py_DECREF(v);
    return again;
}

static PyObject *first_pass(PyObject *self, PyObject *args) {
    PyObject *ctx, *transfers, *vals, *amask, *a0, *p0, *load, *call, *transfer;
    if (!PyArg_ParseTuple(args, "OO!O!OOOOOO:first_pass", &ctx, &PyList_Type, &transfers, &PyDict_Type, &vals,
                          &amask, &a0, &p0, &load, &call, &transfer))
        return NULL;
    int again = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(transfers); i++) {
        PyObject *t = PyList_GET_ITEM(transfers, i);
        Py_INCREF(t);
        int r = step(t, ctx, vals, amask, a0, p0, load, call, transfer);
        Py_DECREF(t);
        if (r < 0) return NULL;
        again |= r;
    }
    return PyBool_FromLong(again);
}

static PyMethodDef methods[] = {
    {"first_pass", first_pass, METH_VARARGS, "The dataflow's first pass (tessera.ptx.fast.first_pass)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_fastscan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastscan(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&moddef);
    if (mod == NULL) return NULL;
    MEM_T = Py_BuildValue("(s)", "<mem>");
    LOCAL_T = Py_BuildValue("(s)", "<local>");
    PARAM_S = PyUnicode_FromString(".param");
    EQ_S = PyUnicode_FromString("=");
    ZERO = PyLong_FromLong(0);
    DATA_O = PyLong_FromLong(E_DATA);
    PyObject *eval_layout = Py_BuildValue("(iiiiii)", E_DATA, E_COPY, E_LOAD, E_CALL, E_SCALE1, S_GLOBAL);
    if (ZERO == NULL || DATA_O == NULL || eval_layout == NULL || PyModule_AddObject(mod, "EVAL_LAYOUT", eval_layout) < 0) {
        Py_XDECREF(eval_layout);
        Py_DECREF(mod);
        return NULL;
    }
    /* (K_COPY..K_IGNORE, K_GUARD..K_BLANK, COPY, MAD, SHL_HI, LOAD, SCALE1, S_GLOBAL.., ACC_R, ACC_W,
     * MEM, "<local>") as fast.py must see them */
    PyObject *layout = Py_BuildValue("(iiiiiiiiiii iiii iiiii iiii ii ss)", K_COPY, K_SCALE, K_SHL, K_LD, K_ST,
                                     K_CVTA, K_MAD, K_CP_NOP, K_CALL, K_OTHER, K_IGNORE, K_GUARD, K_REG,
                                     K_SKIPDIR, K_BLANK, T_COPY, T_MAD, T_SHL_HI, T_LOAD, T_SCALE1, S_GLOBAL,
                                     S_LOCAL, S_PARAM, S_GENERIC, ACC_R, ACC_W, "<mem>", "<local>");
    if (MEM_T == NULL || LOCAL_T == NULL || PARAM_S == NULL || EQ_S == NULL || layout == NULL ||
        PyModule_AddObject(mod, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(mod);
        return NULL;
    }
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(mod, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
