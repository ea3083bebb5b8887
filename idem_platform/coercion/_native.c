/*
 * idem_platform.coercion._native: one JSON line to the contract's canonical bytes,
 * its SHA-1 and its top-level values, in one pass of C, without building a Python
 * object the pipeline does not read.
 *
 * The contract (DESIGN §2) is json.dumps(json.loads(line), sort_keys=True,
 * separators=(",", ":"), ensure_ascii=True, allow_nan=False) with exact integers.
 * The Python path (idem_platform.contract.canonical) gets there through orjson's parse and
 * sorted dump plus checks; this module writes the same bytes straight from the
 * line's tokens. It only ever answers for lines it is sure of: anything unusual
 * (invalid JSON or UTF-8, NUL, lone surrogates, a repeated key, a non-finite float,
 * a huge integer, deep nesting, a top level that is not an object) returns None
 * and the caller takes the Python path, which owns every reject and its reason.
 *
 * Floats: the contract writes float.__repr__. A float token without exponent, with
 * at most 15 significant digits and 1e-4 <= |x| < 1e16 is already that repr once
 * its fraction's trailing zeros go (15 digits round-trip through a double, so no
 * shorter string names the same double); every other float goes through
 * PyOS_double_to_string(x, 'r'), which is what float.__repr__ calls.
 *
 * Reentrant: every buffer written at run time lives in the call's own Scratch (see there),
 * so Python code run from a call (on_unknown, decline), another thread, or a nested call
 * never shares one. What stays at module level is read-only after module init.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/sha.h>

#define MAX_DEPTH 200
#define MAX_INT_DIGITS 4000
/* PostgreSQL's numeric keeps at most this many digits after the point: a float token that
   needs more (1e-16384) is refused by the jsonb _payload, so the Python path decides. */
#define PG_NUMERIC_DSCALE_MAX 16383

enum { N_NULL, N_TRUE, N_FALSE, N_INT, N_FLOAT, N_STR, N_ARR, N_OBJ };

typedef struct {
    uint8_t kind;
    uint8_t plain; /* N_STR: printable ASCII without escapes: the raw span is the canonical text */
    Py_ssize_t start; /* N_STR/N_INT/N_FLOAT: offset in the line; N_ARR/N_OBJ: first entry in kids */
    Py_ssize_t len;   /* span length; N_ARR: elements; N_OBJ: members (key, value pairs in kids) */
} Node;

typedef struct {
    const unsigned char *s;
    Py_ssize_t n, i;
} Line;

typedef struct Member Member;
typedef struct KeySlot KeySlot;

/* One call's scratch: growable arrays reused from line to line of the call, and the cache of
   its object keys. Each entry point has its own, on its stack, freed when it returns: nothing
   the module keeps is written at run time, so a call (or another thread's, while Python code
   run from a call has released the GIL) never sees another's buffers. The module-level
   tables (SPECIAL, HEX, POW10, DAYS, DIRECT_KINDS) are constants, SPECIAL filled once at
   module init and only read after. */
typedef struct {
    Node *nodes;
    Py_ssize_t n_nodes, cap_nodes;
    Py_ssize_t *kids;
    Py_ssize_t n_kids, cap_kids;
    Py_ssize_t *pending;
    Py_ssize_t n_pending, cap_pending;
    unsigned char *out; /* the line's canonical bytes */
    Py_ssize_t n_out, cap_out;
    unsigned char *keybuf; /* decoded (unescaped UTF-8) keys of the line; never longer than the line */
    Py_ssize_t n_keybuf, cap_keybuf;
    unsigned char *text; /* one decoded string value */
    Py_ssize_t cap_text;
    Member *members; /* the keys of the objects being written, nested runs stacked */
    Py_ssize_t cap_members, used;
    const unsigned char *line_bytes; /* the line being read */
    KeySlot *key_slots;              /* allocated on the first key, NULL until then */
    unsigned char *row;              /* one direct row */
    Py_ssize_t n_row, cap_row;
    Py_ssize_t *col_node; /* per column of the direct row's table: its value's node, or -1 */
    Py_ssize_t cap_col_node;
} Scratch;

static void scratch_free(Scratch *cx);

static int grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap)
        return 0;
    Py_ssize_t want = *cap ? *cap : 256;
    while (want < need)
        want *= 2;
    void *bigger = realloc(*buf, (size_t)want * item);
    if (bigger == NULL)
        return -1;
    *buf = bigger;
    *cap = want;
    return 0;
}

static Py_ssize_t new_node(Scratch *cx, uint8_t kind) {
    if (grow((void **)&cx->nodes, &cx->cap_nodes, cx->n_nodes + 1, sizeof(Node)) < 0)
        return -1;
    cx->nodes[cx->n_nodes].kind = kind;
    cx->nodes[cx->n_nodes].plain = 0;
    cx->nodes[cx->n_nodes].start = 0;
    cx->nodes[cx->n_nodes].len = 0;
    return cx->n_nodes++;
}

static int push_pending(Scratch *cx, Py_ssize_t v) {
    if (grow((void **)&cx->pending, &cx->cap_pending, cx->n_pending + 1, sizeof(Py_ssize_t)) < 0)
        return -1;
    cx->pending[cx->n_pending++] = v;
    return 0;
}

/* The children gathered since `mark` become one contiguous run of kids. */
static Py_ssize_t close_container(Scratch *cx, Py_ssize_t mark) {
    Py_ssize_t count = cx->n_pending - mark;
    if (grow((void **)&cx->kids, &cx->cap_kids, cx->n_kids + count, sizeof(Py_ssize_t)) < 0)
        return -1;
    Py_ssize_t first = cx->n_kids;
    memcpy(cx->kids + cx->n_kids, cx->pending + mark, (size_t)count * sizeof(Py_ssize_t));
    cx->n_kids += count;
    cx->n_pending = mark;
    return first;
}

static inline void skip_ws(Line *l) {
    while (l->i < l->n) {
        unsigned char c = l->s[l->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        l->i++;
    }
}

static inline int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static inline int hex_value(unsigned char c) {
    if (c <= '9')
        return c - '0';
    return (c | 0x20) - 'a' + 10;
}

/* Bytes a string token's scan stops at: the quote, a backslash, controls, DEL and non-ASCII.
   Filled once at module init (init_special), read-only after. */
static unsigned char SPECIAL[256];

static void init_special(void) {
    for (int c = 0; c < 256; c++)
        SPECIAL[c] = c == '"' || c == '\\' || c < 0x20 || c >= 0x7f;
}

/* A string token (l->i at its opening quote): syntax only; escapes and UTF-8 are
   checked when it is decoded. */
static Py_ssize_t parse_string(Scratch *cx, Line *l) {
    const unsigned char *s = l->s;
    Py_ssize_t i = l->i + 1, start = i;
    uint8_t plain = 1;
    for (;;) {
        while (i < l->n && !SPECIAL[s[i]])
            i++;
        if (i >= l->n)
            return -1;
        unsigned char c = s[i];
        if (c == '"')
            break;
        if (c < 0x20)
            return -1; /* a raw control character: json refuses it */
        if (c == '\\') {
            plain = 0;
            if (i + 1 >= l->n)
                return -1;
            unsigned char e = s[i + 1];
            if (e == 'u') {
                if (i + 5 >= l->n || !is_hex(s[i + 2]) || !is_hex(s[i + 3]) || !is_hex(s[i + 4]) ||
                    !is_hex(s[i + 5]))
                    return -1;
                i += 6;
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
                return -1;
            i += 2;
            continue;
        }
        if (c >= 0x7f)
            plain = 0;
        i++;
    }
    Py_ssize_t node = new_node(cx, N_STR);
    if (node < 0)
        return -1;
    cx->nodes[node].plain = plain;
    cx->nodes[node].start = start;
    cx->nodes[node].len = i - start;
    l->i = i + 1;
    return node;
}

/* Past the digits at s[*i]; 0 if there is not one (JSON wants one after '.', 'e' and a sign). */
static inline int skip_digits(const unsigned char *s, Py_ssize_t n, Py_ssize_t *i) {
    Py_ssize_t j = *i;
    while (j < n && s[j] >= '0' && s[j] <= '9')
        j++;
    int any = j > *i;
    *i = j;
    return any;
}

static Py_ssize_t parse_number(Scratch *cx, Line *l) {
    const unsigned char *s = l->s;
    Py_ssize_t i = l->i, start = i, n = l->n;
    int is_int = 1;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0') {
        i++;
    } else if (!(i < n && s[i] >= '1' && s[i] <= '9') || !skip_digits(s, n, &i)) {
        return -1;
    }
    Py_ssize_t frac_digits = 0;
    if (i < n && s[i] == '.') {
        i++;
        Py_ssize_t first = i;
        if (!skip_digits(s, n, &i))
            return -1;
        frac_digits = i - first;
        is_int = 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int negative = i < n && s[i] == '-';
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        Py_ssize_t first = i;
        if (!skip_digits(s, n, &i))
            return -1;
        while (first < i - 1 && s[first] == '0')
            first++;
        if (i - first > 6)
            return -1; /* |exponent| >= 10^6: PostgreSQL's numeric may refuse it (see below) */
        Py_ssize_t exponent = 0;
        for (Py_ssize_t d = first; d < i; d++)
            exponent = exponent * 10 + (s[d] - '0');
        if (negative && frac_digits + exponent > PG_NUMERIC_DSCALE_MAX)
            return -1; /* _payload's jsonb keeps it as numeric, whose scale stops at 16383 digits */
        is_int = 0;
    } else if (frac_digits > PG_NUMERIC_DSCALE_MAX) {
        return -1;
    }
    if (is_int && i - start > MAX_INT_DIGITS)
        return -1; /* int() refuses it past sys.get_int_max_str_digits(): the Python path says so */
    Py_ssize_t node = new_node(cx, is_int ? N_INT : N_FLOAT);
    if (node < 0)
        return -1;
    cx->nodes[node].start = start;
    cx->nodes[node].len = i - start;
    l->i = i;
    return node;
}

static Py_ssize_t parse_value(Scratch *cx, Line *l, int depth);

static Py_ssize_t parse_container(Scratch *cx, Line *l, int depth, int object) {
    if (depth > MAX_DEPTH)
        return -1;
    Py_ssize_t node = new_node(cx, object ? N_OBJ : N_ARR);
    if (node < 0)
        return -1;
    Py_ssize_t mark = cx->n_pending, count = 0;
    unsigned char close = object ? '}' : ']';
    l->i++;
    skip_ws(l);
    if (l->i < l->n && l->s[l->i] == close) {
        l->i++;
    } else {
        for (;;) {
            if (object) {
                skip_ws(l);
                if (l->i >= l->n || l->s[l->i] != '"')
                    return -1;
                Py_ssize_t key = parse_string(cx, l);
                if (key < 0 || push_pending(cx, key) < 0)
                    return -1;
                skip_ws(l);
                if (l->i >= l->n || l->s[l->i] != ':')
                    return -1;
                l->i++;
            }
            Py_ssize_t value = parse_value(cx, l, depth + 1);
            if (value < 0 || push_pending(cx, value) < 0)
                return -1;
            count++;
            skip_ws(l);
            if (l->i >= l->n)
                return -1;
            unsigned char c = l->s[l->i++];
            if (c == ',')
                continue;
            if (c == close)
                break;
            return -1;
        }
    }
    Py_ssize_t first = close_container(cx, mark);
    if (first < 0)
        return -1;
    cx->nodes[node].start = first;
    cx->nodes[node].len = count;
    return node;
}

static Py_ssize_t parse_value(Scratch *cx, Line *l, int depth) {
    skip_ws(l);
    if (l->i >= l->n)
        return -1;
    unsigned char c = l->s[l->i];
    switch (c) {
    case '{':
        return parse_container(cx, l, depth, 1);
    case '[':
        return parse_container(cx, l, depth, 0);
    case '"':
        return parse_string(cx, l);
    case 't':
        if (l->n - l->i >= 4 && memcmp(l->s + l->i, "true", 4) == 0) {
            l->i += 4;
            return new_node(cx, N_TRUE);
        }
        return -1;
    case 'f':
        if (l->n - l->i >= 5 && memcmp(l->s + l->i, "false", 5) == 0) {
            l->i += 5;
            return new_node(cx, N_FALSE);
        }
        return -1;
    case 'n':
        if (l->n - l->i >= 4 && memcmp(l->s + l->i, "null", 4) == 0) {
            l->i += 4;
            return new_node(cx, N_NULL);
        }
        return -1;
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(cx, l);
        return -1;
    }
}

/* ---- strings ------------------------------------------------------------------ */

static inline unsigned char *put_utf8(unsigned char *d, uint32_t cp) {
    if (cp < 0x80) {
        *d++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *d++ = (unsigned char)(0xC0 | (cp >> 6));
        *d++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *d++ = (unsigned char)(0xE0 | (cp >> 12));
        *d++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *d++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *d++ = (unsigned char)(0xF0 | (cp >> 18));
        *d++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        *d++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *d++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    return d;
}

/* One UTF-8 sequence at s[0..n): its code point and length, or length 0 if it is not
   valid UTF-8 as Python's strict decoder reads it (no overlongs, no surrogates). */
static inline int next_utf8(const unsigned char *s, Py_ssize_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        if (n < 2 || (s[1] & 0xC0) != 0x80)
            return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && s[1] < 0xA0)
            return 0;
        if (c == 0xED && s[1] > 0x9F)
            return 0;
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90)
            return 0;
        if (c == 0xF4 && s[1] > 0x8F)
            return 0;
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

static inline uint32_t hex4(const unsigned char *s) {
    return (uint32_t)(hex_value(s[0]) << 12 | hex_value(s[1]) << 8 | hex_value(s[2]) << 4 | hex_value(s[3]));
}

/* A string token's text, unescaped, as UTF-8 into d (room for len bytes: never more).
   -1: invalid UTF-8, a lone surrogate or NUL (rejects the Python path words). */
static Py_ssize_t decode_string(const unsigned char *s, Py_ssize_t len, unsigned char *d) {
    unsigned char *start = d;
    Py_ssize_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c == '\\') {
            unsigned char e = s[i + 1];
            switch (e) {
            case '"': *d++ = '"'; i += 2; continue;
            case '\\': *d++ = '\\'; i += 2; continue;
            case '/': *d++ = '/'; i += 2; continue;
            case 'b': *d++ = '\b'; i += 2; continue;
            case 'f': *d++ = '\f'; i += 2; continue;
            case 'n': *d++ = '\n'; i += 2; continue;
            case 'r': *d++ = '\r'; i += 2; continue;
            case 't': *d++ = '\t'; i += 2; continue;
            default: break; /* 'u': the parser let nothing else through */
            }
            uint32_t cp = hex4(s + i + 2);
            i += 6;
            if (cp == 0)
                return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 6 > len || s[i] != '\\' || s[i + 1] != 'u')
                    return -1;
                uint32_t low = hex4(s + i + 2);
                if (low < 0xDC00 || low > 0xDFFF)
                    return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                i += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return -1;
            }
            d = put_utf8(d, cp);
            continue;
        }
        if (c < 0x80) {
            *d++ = c;
            i++;
            continue;
        }
        uint32_t cp;
        int k = next_utf8(s + i, len - i, &cp);
        if (k == 0)
            return -1;
        memcpy(d, s + i, (size_t)k);
        d += k;
        i += k;
    }
    return d - start;
}

static int reserve_out(Scratch *cx, Py_ssize_t more) {
    return grow((void **)&cx->out, &cx->cap_out, cx->n_out + more, 1);
}

static const char HEX[] = "0123456789abcdef";

static inline unsigned char *put_u_escape(unsigned char *d, uint32_t unit) {
    d[0] = '\\';
    d[1] = 'u';
    d[2] = (unsigned char)HEX[(unit >> 12) & 0xF];
    d[3] = (unsigned char)HEX[(unit >> 8) & 0xF];
    d[4] = (unsigned char)HEX[(unit >> 4) & 0xF];
    d[5] = (unsigned char)HEX[unit & 0xF];
    return d + 6;
}

/* Decoded UTF-8 text as json.dumps(ensure_ascii=True) writes a string. */
static int emit_text(Scratch *cx, const unsigned char *t, Py_ssize_t len) {
    if (reserve_out(cx, len * 12 + 2) < 0) /* at worst every 4-byte character becomes 12 bytes */
        return -1;
    unsigned char *d = cx->out + cx->n_out;
    *d++ = '"';
    Py_ssize_t i = 0;
    while (i < len) {
        unsigned char c = t[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            *d++ = c;
            i++;
            continue;
        }
        if (c < 0x80) {
            i++;
            switch (c) {
            case '"': *d++ = '\\'; *d++ = '"'; break;
            case '\\': *d++ = '\\'; *d++ = '\\'; break;
            case '\n': *d++ = '\\'; *d++ = 'n'; break;
            case '\r': *d++ = '\\'; *d++ = 'r'; break;
            case '\t': *d++ = '\\'; *d++ = 't'; break;
            case '\b': *d++ = '\\'; *d++ = 'b'; break;
            case '\f': *d++ = '\\'; *d++ = 'f'; break;
            default: d = put_u_escape(d, c); break; /* other controls and DEL */
            }
            continue;
        }
        uint32_t cp;
        int k = next_utf8(t + i, len - i, &cp); /* valid: decode_string checked it */
        i += k;
        if (cp >= 0x10000) {
            cp -= 0x10000;
            d = put_u_escape(d, 0xD800 + (cp >> 10));
            d = put_u_escape(d, 0xDC00 + (cp & 0x3FF));
        } else {
            d = put_u_escape(d, cp);
        }
    }
    *d++ = '"';
    cx->n_out = d - cx->out;
    return 0;
}

static int ensure_text(Scratch *cx, Py_ssize_t len) {
    return grow((void **)&cx->text, &cx->cap_text, len + 1, 1);
}

/* ---- numbers ------------------------------------------------------------------ */

/* The canonical text of a float token if the short rule (see the top) covers it: 1, else 0. */
static int short_float(Scratch *cx, const unsigned char *s, Py_ssize_t len) {
    Py_ssize_t i = 0, dot = -1;
    if (s[0] == '-')
        i = 1;
    for (Py_ssize_t j = i; j < len; j++) {
        if (s[j] == '.')
            dot = j;
        else if (s[j] < '0' || s[j] > '9')
            return 0; /* an exponent */
    }
    if (dot < 0)
        return 0;
    Py_ssize_t end = len;
    while (end > dot + 2 && s[end - 1] == '0')
        end--; /* the fraction's trailing zeros, keeping one digit */
    Py_ssize_t int_digits = dot - i;
    Py_ssize_t first = -1; /* first significant digit */
    for (Py_ssize_t j = i; j < end; j++) {
        if (s[j] != '.' && s[j] != '0') {
            first = j;
            break;
        }
    }
    if (first < 0) { /* zero: "0.0" or "-0.0" */
        if (reserve_out(cx, 4) < 0)
            return -1;
        if (s[0] == '-')
            cx->out[cx->n_out++] = '-';
        memcpy(cx->out + cx->n_out, "0.0", 3);
        cx->n_out += 3;
        return 1;
    }
    Py_ssize_t last = end - 1;
    while (s[last] == '0' || s[last] == '.')
        last--;
    Py_ssize_t sig = last - first + 1 - (first < dot && last > dot ? 1 : 0);
    if (sig > 15 || int_digits > 16)
        return 0;
    if (first > dot && first - dot - 1 > 3)
        return 0; /* below 1e-4: repr writes an exponent */
    if (reserve_out(cx, end) < 0)
        return -1;
    memcpy(cx->out + cx->n_out, s, (size_t)end);
    cx->n_out += end;
    return 1;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static double token_double(const unsigned char *s, Py_ssize_t len, int *ok) {
    /* At most 15 digits and no exponent: the digits as an integer and 10^k are both
       exact doubles, and IEEE division rounds their quotient correctly, as strtod does. */
    if (len <= 17) {
        Py_ssize_t i = s[0] == '-' ? 1 : 0, digits = 0, frac = -1;
        uint64_t m = 0;
        for (; i < len; i++) {
            unsigned char c = s[i];
            if (c == '.') {
                frac = 0;
                continue;
            }
            if (c < '0' || c > '9')
                break;
            m = m * 10 + (c - '0');
            digits++;
            if (frac >= 0)
                frac++;
        }
        if (i == len && digits <= 15) {
            double x = (double)m / POW10[frac > 0 ? frac : 0];
            *ok = 1;
            return s[0] == '-' ? -x : x;
        }
    }
    *ok = 0;
    char numbuf[MAX_INT_DIGITS + 64];
    if (len >= (Py_ssize_t)sizeof(numbuf))
        return 0.0;
    memcpy(numbuf, s, (size_t)len);
    numbuf[len] = '\0';
    char *end = NULL;
    double x = PyOS_string_to_double(numbuf, &end, NULL);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0.0;
    }
    if (end != numbuf + len || !isfinite(x))
        return 0.0;
    *ok = 1;
    return x;
}

static int emit_float(Scratch *cx, const unsigned char *s, Py_ssize_t len) {
    int done = short_float(cx, s, len);
    if (done != 0)
        return done < 0 ? -1 : 0;
    int ok;
    double x = token_double(s, len, &ok);
    if (!ok)
        return -1; /* inf (1e400) or unreadable: the Python path rejects it */
    char *repr = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t k = (Py_ssize_t)strlen(repr);
    if (reserve_out(cx, k) < 0) {
        PyMem_Free(repr);
        return -1;
    }
    memcpy(cx->out + cx->n_out, repr, (size_t)k);
    cx->n_out += k;
    PyMem_Free(repr);
    return 0;
}

/* ---- the canonical form ------------------------------------------------------- */

struct Member {
    const unsigned char *key; /* decoded UTF-8: byte order is code point order, str's order */
    Py_ssize_t len;
    Py_ssize_t member; /* index of the key node in kids */
};

static int member_cmp(const void *a, const void *b) {
    const Member *x = a, *y = b;
    Py_ssize_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, (size_t)n);
    if (c != 0)
        return c;
    return (x->len > y->len) - (x->len < y->len);
}

/* A key's decoded text: the raw span if plain, else decoded into keybuf. */
static int key_text(Scratch *cx, Py_ssize_t node, const unsigned char **key, Py_ssize_t *len) {
    Node *k = &cx->nodes[node];
    if (k->plain) {
        *key = cx->line_bytes + k->start;
        *len = k->len;
        return 0;
    }
    Py_ssize_t got = decode_string(cx->line_bytes + k->start, k->len, cx->keybuf + cx->n_keybuf);
    if (got < 0)
        return -1;
    *key = cx->keybuf + cx->n_keybuf;
    *len = got;
    cx->n_keybuf += got;
    return 0;
}

static int emit(Scratch *cx, Py_ssize_t node);

static int emit_string_node(Scratch *cx, Node *v) {
    if (v->plain) {
        if (reserve_out(cx, v->len + 2) < 0)
            return -1;
        cx->out[cx->n_out++] = '"';
        memcpy(cx->out + cx->n_out, cx->line_bytes + v->start, (size_t)v->len);
        cx->n_out += v->len;
        cx->out[cx->n_out++] = '"';
        return 0;
    }
    if (ensure_text(cx, v->len) < 0)
        return -1;
    Py_ssize_t got = decode_string(cx->line_bytes + v->start, v->len, cx->text);
    if (got < 0)
        return -1;
    return emit_text(cx, cx->text, got);
}

static int emit_object(Scratch *cx, Node *v) {
    Py_ssize_t count = v->len, first = v->start;
    if (count == 0) {
        if (reserve_out(cx, 2) < 0)
            return -1;
        cx->out[cx->n_out++] = '{';
        cx->out[cx->n_out++] = '}';
        return 0;
    }
    /* members is shared by every level: this object's run sits above its parents'. */
    Py_ssize_t base = cx->used;
    if (grow((void **)&cx->members, &cx->cap_members, base + count, sizeof(Member)) < 0)
        return -1;
    for (Py_ssize_t m = 0; m < count; m++) {
        Member *mm = &cx->members[base + m];
        mm->member = first + 2 * m;
        if (key_text(cx, cx->kids[first + 2 * m], &mm->key, &mm->len) < 0)
            return -1;
    }
    Member *run = cx->members + base;
    if (count > 1) {
        if (count <= 16) {
            for (Py_ssize_t a = 1; a < count; a++) {
                Member t = run[a];
                Py_ssize_t b = a;
                while (b > 0 && member_cmp(&run[b - 1], &t) > 0) {
                    run[b] = run[b - 1];
                    b--;
                }
                run[b] = t;
            }
        } else {
            qsort(run, (size_t)count, sizeof(Member), member_cmp);
        }
        for (Py_ssize_t a = 1; a < count; a++)
            if (member_cmp(&run[a - 1], &run[a]) == 0)
                return -1; /* a repeated key: a reject the Python path words */
    }
    cx->used = base + count;
    int status = 0;
    if (reserve_out(cx, 1) < 0) {
        status = -1;
        goto done;
    }
    cx->out[cx->n_out++] = '{';
    for (Py_ssize_t m = 0; m < count; m++) {
        run = cx->members + base; /* emit() may have grown members */
        Py_ssize_t at = run[m].member;
        Node *key = &cx->nodes[cx->kids[at]];
        if (key->plain) {
            if (emit_string_node(cx, key) < 0) {
                status = -1;
                goto done;
            }
        } else if (emit_text(cx, run[m].key, run[m].len) < 0) {
            status = -1;
            goto done;
        }
        if (reserve_out(cx, 1) < 0) {
            status = -1;
            goto done;
        }
        cx->out[cx->n_out++] = ':';
        if (emit(cx, cx->kids[at + 1]) < 0) {
            status = -1;
            goto done;
        }
        if (reserve_out(cx, 1) < 0) {
            status = -1;
            goto done;
        }
        cx->out[cx->n_out++] = m + 1 < count ? ',' : '}';
    }
done:
    cx->used = base;
    return status;
}

static int emit(Scratch *cx, Py_ssize_t node) {
    Node *v = &cx->nodes[node];
    switch (v->kind) {
    case N_NULL:
    case N_TRUE:
    case N_FALSE: {
        const char *word = v->kind == N_NULL ? "null" : v->kind == N_TRUE ? "true" : "false";
        Py_ssize_t k = v->kind == N_FALSE ? 5 : 4;
        if (reserve_out(cx, k) < 0)
            return -1;
        memcpy(cx->out + cx->n_out, word, (size_t)k);
        cx->n_out += k;
        return 0;
    }
    case N_INT: {
        const unsigned char *s = cx->line_bytes + v->start;
        if (v->len == 2 && s[0] == '-' && s[1] == '0') { /* int("-0") is 0 */
            if (reserve_out(cx, 1) < 0)
                return -1;
            cx->out[cx->n_out++] = '0';
            return 0;
        }
        if (reserve_out(cx, v->len) < 0)
            return -1;
        memcpy(cx->out + cx->n_out, s, (size_t)v->len);
        cx->n_out += v->len;
        return 0;
    }
    case N_FLOAT:
        return emit_float(cx, cx->line_bytes + v->start, v->len);
    case N_STR:
        return emit_string_node(cx, v);
    case N_ARR: {
        if (reserve_out(cx, 1) < 0)
            return -1;
        cx->out[cx->n_out++] = '[';
        Py_ssize_t count = v->len, first = v->start;
        for (Py_ssize_t e = 0; e < count; e++) {
            if (e) {
                if (reserve_out(cx, 1) < 0)
                    return -1;
                cx->out[cx->n_out++] = ',';
            }
            if (emit(cx, cx->kids[first + e]) < 0)
                return -1;
        }
        if (reserve_out(cx, 1) < 0)
            return -1;
        cx->out[cx->n_out++] = ']';
        return 0;
    }
    default:
        return emit_object(cx, v);
    }
}

/* ---- Python values ------------------------------------------------------------ */

static PyObject *value_of(Scratch *cx, Py_ssize_t node);

/* Object keys repeat from record to record: plain short ones are made once and
   reused (with their cached hash), as orjson does. Direct-mapped; a clash replaces. */
#define KEY_SLOTS 1024
#define KEY_MAX 48
struct KeySlot {
    Py_ssize_t len;
    unsigned char bytes[KEY_MAX];
    PyObject *str;
};

static void scratch_free(Scratch *cx) {
    if (cx->key_slots != NULL)
        for (Py_ssize_t k = 0; k < KEY_SLOTS; k++)
            Py_XDECREF(cx->key_slots[k].str);
    free(cx->key_slots);
    free(cx->nodes);
    free(cx->kids);
    free(cx->pending);
    free(cx->out);
    free(cx->keybuf);
    free(cx->text);
    free(cx->members);
    free(cx->row);
    free(cx->col_node);
}

static PyObject *key_of(Scratch *cx, Node *v) {
    if (!v->plain || v->len > KEY_MAX)
        return NULL;
    const unsigned char *s = cx->line_bytes + v->start;
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < v->len; i++)
        h = (h ^ s[i]) * 16777619u;
    if (cx->key_slots == NULL && (cx->key_slots = calloc(KEY_SLOTS, sizeof(KeySlot))) == NULL)
        return PyErr_NoMemory();
    KeySlot *slot = &cx->key_slots[(h ^ (h >> 16)) & (KEY_SLOTS - 1)];
    if (slot->str != NULL && slot->len == v->len && memcmp(slot->bytes, s, (size_t)v->len) == 0) {
        Py_INCREF(slot->str);
        return slot->str;
    }
    PyObject *str = PyUnicode_DecodeASCII((const char *)s, v->len, NULL);
    if (str == NULL)
        return NULL;
    if (PyObject_Hash(str) == -1) {
        Py_DECREF(str);
        return NULL;
    }
    Py_XSETREF(slot->str, str);
    Py_INCREF(str);
    slot->len = v->len;
    memcpy(slot->bytes, s, (size_t)v->len);
    return str;
}

static PyObject *string_of(Scratch *cx, Node *v) {
    if (v->plain)
        return PyUnicode_DecodeASCII((const char *)cx->line_bytes + v->start, v->len, NULL);
    if (ensure_text(cx, v->len) < 0)
        return PyErr_NoMemory();
    Py_ssize_t got = decode_string(cx->line_bytes + v->start, v->len, cx->text);
    if (got < 0) { /* cannot happen: the canonical pass decoded it already */
        PyErr_SetString(PyExc_ValueError, "undecodable string");
        return NULL;
    }
    return PyUnicode_DecodeUTF8((const char *)cx->text, got, NULL);
}

/* JSON values are trees: a list or dict built here can only be part of a reference cycle
   through a container it holds. One whose items are all untracked (str, numbers, None,
   bools, or containers untracked the same way) is untracked from the cyclic garbage
   collector, as CPython does itself for such tuples and dicts: the collector then neither
   walks a batch's records nor runs its full passes for them (which a batch of records kept
   until their columns are converted otherwise triggers every few thousand records). Memory
   safe either way: the collector only ever skips an untracked object, and reference
   counting frees it. A dict re-tracks itself if a container is put into it later. */
static void untrack_list(PyObject *list) {
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++)
        if (PyObject_GC_IsTracked(PyList_GET_ITEM(list, k)))
            return;
    PyObject_GC_UnTrack(list);
}

/* A dict's values (its keys are str): untracked when none of them is tracked. */
static void untrack_dict(PyObject *dict) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value))
        if (PyObject_GC_IsTracked(value))
            return;
    if (PyObject_GC_IsTracked(dict))
        PyObject_GC_UnTrack(dict);
}

static PyObject *int_of(const unsigned char *s, Py_ssize_t len) {
    if (len <= 18) {
        long long x = 0;
        Py_ssize_t i = s[0] == '-' ? 1 : 0;
        for (Py_ssize_t j = i; j < len; j++)
            x = x * 10 + (s[j] - '0');
        return PyLong_FromLongLong(i ? -x : x);
    }
    char numbuf[MAX_INT_DIGITS + 64]; /* parse_number let no integer longer than MAX_INT_DIGITS through */
    memcpy(numbuf, s, (size_t)len);
    numbuf[len] = '\0';
    return PyLong_FromString(numbuf, NULL, 10);
}

static PyObject *value_of(Scratch *cx, Py_ssize_t node) {
    Node *v = &cx->nodes[node];
    switch (v->kind) {
    case N_NULL:
        Py_RETURN_NONE;
    case N_TRUE:
        Py_RETURN_TRUE;
    case N_FALSE:
        Py_RETURN_FALSE;
    case N_INT:
        return int_of(cx->line_bytes + v->start, v->len);
    case N_FLOAT: {
        int ok;
        double x = token_double(cx->line_bytes + v->start, v->len, &ok);
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "unreadable float");
            return NULL;
        }
        return PyFloat_FromDouble(x);
    }
    case N_STR:
        return string_of(cx, v);
    case N_ARR: {
        PyObject *list = PyList_New(v->len);
        if (list == NULL)
            return NULL;
        for (Py_ssize_t e = 0; e < v->len; e++) {
            PyObject *item = value_of(cx, cx->kids[v->start + e]);
            if (item == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, e, item);
        }
        untrack_list(list);
        return list;
    }
    default: {
        PyObject *dict = PyDict_New();
        if (dict == NULL)
            return NULL;
        for (Py_ssize_t m = 0; m < v->len; m++) {
            Py_ssize_t at = v->start + 2 * m;
            Node *k = &cx->nodes[cx->kids[at]];
            PyObject *key = key_of(cx, k);
            if (key == NULL && !PyErr_Occurred())
                key = string_of(cx, k);
            PyObject *item = key ? value_of(cx, cx->kids[at + 1]) : NULL;
            if (item == NULL || PyDict_SetItem(dict, key, item) < 0) {
                Py_XDECREF(key);
                Py_XDECREF(item);
                Py_DECREF(dict);
                return NULL;
            }
            Py_DECREF(key);
            Py_DECREF(item);
        }
        untrack_dict(dict);
        return dict;
    }
    }
}

/* ---- SHA-1 ---------------------------------------------------------------------- */

/* OpenSSL's block function (SHA-NI where the CPU has it): the low-level calls, since
   OpenSSL 3's one-shot SHA1() fetches the algorithm on every call. */
static void sha1_hex(const unsigned char *data, Py_ssize_t len, char hex[40]) {
    unsigned char md[SHA_DIGEST_LENGTH];
    SHA_CTX ctx;
    SHA1_Init(&ctx);
    SHA1_Update(&ctx, data, (size_t)len);
    SHA1_Final(md, &ctx);
    for (int b = 0; b < SHA_DIGEST_LENGTH; b++) {
        hex[2 * b] = HEX[md[b] >> 4];
        hex[2 * b + 1] = HEX[md[b] & 0xF];
    }
}

/* ---- one line ------------------------------------------------------------------ */

/* The line's record (a dict), canonical bytes and SHA-1 hex: 1; the Python path must
   decide: 0; a Python error (memory): -1. See canonical_line for `shallow`. */
/* Parse the line, write its canonical bytes (`out`) and their SHA-1 (`hex`): the top-level
   object's node, or -2 when the Python path must decide, or -1 on a Python error. */
static Py_ssize_t parse_line(Scratch *cx, const unsigned char *s, Py_ssize_t len, char hex[40]) {
    Line l = {s, len, 0};
    cx->line_bytes = s;
    cx->n_nodes = cx->n_kids = cx->n_pending = cx->n_out = cx->n_keybuf = 0;
    if (grow((void **)&cx->keybuf, &cx->cap_keybuf, len + 1, 1) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    skip_ws(&l);
    if (l.i >= l.n || l.s[l.i] != '{')
        return -2;
    Py_ssize_t top = parse_value(cx, &l, 1);
    if (top < 0)
        return PyErr_Occurred() ? -1 : -2;
    skip_ws(&l);
    if (l.i != l.n)
        return -2;
    if (emit(cx, top) < 0)
        return PyErr_Occurred() ? -1 : -2;
    sha1_hex(cx->out, cx->n_out, hex);
    return top;
}

/* The parsed line's record (a dict), canonical bytes and SHA-1 hex (see canonical_line for
   `shallow`): 1, or -1 on a Python error. */
static int build_record(Scratch *cx, Py_ssize_t top, const char hex[40], PyObject *shallow, PyObject **record_out,
                        PyObject **canonical_out, PyObject **digest_out) {
    PyObject *canonical = PyBytes_FromStringAndSize((const char *)cx->out, cx->n_out);
    PyObject *digest = PyUnicode_FromStringAndSize(hex, 40);
    PyObject *record = PyDict_New();
    if (canonical == NULL || digest == NULL || record == NULL)
        goto fail;
    int any_shallow = PySet_GET_SIZE(shallow) > 0;
    for (Py_ssize_t m = 0; m < cx->nodes[top].len; m++) {
        Py_ssize_t at = cx->nodes[top].start + 2 * m;
        Node *k = &cx->nodes[cx->kids[at]];
        PyObject *key = key_of(cx, k);
        if (key == NULL && !PyErr_Occurred())
            key = string_of(cx, k);
        if (key == NULL)
            goto fail;
        int is_shallow = any_shallow ? PySet_Contains(shallow, key) : 0;
        PyObject *item;
        if (is_shallow < 0) {
            item = NULL;
        } else if (is_shallow) {
            item = cx->nodes[cx->kids[at + 1]].kind == N_NULL ? Py_None : Py_Ellipsis;
            Py_INCREF(item);
        } else {
            item = value_of(cx, cx->kids[at + 1]);
        }
        if (item == NULL || PyDict_SetItem(record, key, item) < 0) {
            Py_DECREF(key);
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(key);
        Py_DECREF(item);
    }
    untrack_dict(record);
    *record_out = record;
    *canonical_out = canonical;
    *digest_out = digest;
    return 1;
fail:
    Py_XDECREF(record);
    Py_XDECREF(digest);
    Py_XDECREF(canonical);
    return -1;
}

/* The line's record, canonical bytes and SHA-1 hex: 1; the Python path must decide: 0; a
   Python error (memory): -1. */
static int read_line(Scratch *cx, const unsigned char *s, Py_ssize_t len, PyObject *shallow, PyObject **record_out,
                     PyObject **canonical_out, PyObject **digest_out) {
    char hex[40];
    Py_ssize_t top = parse_line(cx, s, len, hex);
    if (top < 0)
        return top == -1 ? -1 : 0;
    return build_record(cx, top, hex, shallow, record_out, canonical_out, digest_out);
}

/* ---- the entry points ---------------------------------------------------------- */

PyDoc_STRVAR(canonical_line_doc,
             "canonical_line(line: bytes, shallow: frozenset[str]) -> tuple[dict, bytes, str] | None\n\n"
             "The line's top-level object as a dict, its canonical bytes (DESIGN 2) and their SHA-1\n"
             "in hex; None whenever the Python path must decide (it owns every reject). Top-level\n"
             "fields named in `shallow` hold None if null and Ellipsis otherwise (the caller never\n"
             "reads their values); all other values are built as json.loads builds them.");

static PyObject *canonical_line(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *shallow;
    if (!PyArg_ParseTuple(args, "y*O!", &buf, &PyFrozenSet_Type, &shallow))
        return NULL;
    PyObject *record, *canonical, *digest;
    Scratch scratch = {0}, *cx = &scratch;
    int got = read_line(cx, (const unsigned char *)buf.buf, buf.len, shallow, &record, &canonical, &digest);
    scratch_free(cx);
    PyBuffer_Release(&buf);
    if (got < 0)
        return NULL;
    if (got == 0)
        Py_RETURN_NONE;
    PyObject *result = PyTuple_Pack(3, record, canonical, digest);
    Py_DECREF(record);
    Py_DECREF(canonical);
    Py_DECREF(digest);
    return result;
}

static int append_steal(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int status = PyList_Append(list, item);
    Py_DECREF(item);
    return status;
}

/* ---- direct values: a plain record's typed columns as COPY fields -------------------
 *
 * On the commit path a record whose every value is of the plain kind needs no Python
 * object at all: scan_lines writes its typed columns in PostgreSQL's binary COPY format
 * straight from the parsed line (its "tail"), and once records.py has decided the line is
 * kept, with which key, write_direct puts the staged system columns in front. The values
 * are those the Arrow path stages (idem_platform.coercion.columns' fast path, then pgpq):
 * anything that path could convert differently or reject (a value of another JSON kind, a
 * number that needs rounding into its column, a timestamp of any other shape, a null
 * required field) makes the line's facts its record instead. */

#define PG_EPOCH_US 946684800000000LL /* 2000-01-01 in Unix microseconds */
#define MAX_DIRECT_COLUMNS 1600      /* PostgreSQL's own column limit */
#define FLOAT32_LIMIT 3.4028234663852886e38

static inline int row_reserve(Scratch *cx, Py_ssize_t more) {
    if (grow((void **)&cx->row, &cx->cap_row, cx->n_row + more, 1) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static inline void put_u16(Scratch *cx, uint16_t v) {
    cx->row[cx->n_row++] = (unsigned char)(v >> 8);
    cx->row[cx->n_row++] = (unsigned char)v;
}

static inline void put_u32(Scratch *cx, uint32_t v) {
    for (int b = 3; b >= 0; b--)
        cx->row[cx->n_row++] = (unsigned char)(v >> (8 * b));
}

static inline void put_u64(Scratch *cx, uint64_t v) {
    for (int b = 7; b >= 0; b--)
        cx->row[cx->n_row++] = (unsigned char)(v >> (8 * b));
}

static int put_bytes(Scratch *cx, const void *data, Py_ssize_t len) {
    if (row_reserve(cx, 4 + len) < 0)
        return -1;
    put_u32(cx, (uint32_t)len);
    memcpy(cx->row + cx->n_row, data, (size_t)len);
    cx->n_row += len;
    return 0;
}

static int put_null(Scratch *cx) {
    if (row_reserve(cx, 4) < 0)
        return -1;
    put_u32(cx, 0xFFFFFFFFu);
    return 0;
}

static int put_i64(Scratch *cx, int64_t v) {
    if (row_reserve(cx, 12) < 0)
        return -1;
    put_u32(cx, 8);
    put_u64(cx, (uint64_t)v);
    return 0;
}

static int put_f64(Scratch *cx, double x) {
    uint64_t bits;
    memcpy(&bits, &x, 8);
    return put_i64(cx, (int64_t)bits);
}

/* An integer token of at most `max_digits` digits (no more than 18): 1 and its value; else 0. */
static int token_int(const unsigned char *s, Py_ssize_t len, Py_ssize_t max_digits, int64_t *value) {
    Py_ssize_t i = s[0] == '-' ? 1 : 0;
    if (len - i > max_digits)
        return 0;
    int64_t x = 0;
    for (Py_ssize_t j = i; j < len; j++)
        x = x * 10 + (s[j] - '0');
    *value = i ? -x : x;
    return 1;
}

/* A number node as the float64 Arrow makes of it (a float, or an int exact in a double): 1; else 0. */
static int number_value(Scratch *cx, Node *v, double *x) {
    const unsigned char *s = cx->line_bytes + v->start;
    if (v->kind == N_INT) {
        int64_t i;
        if (!token_int(s, v->len, 15, &i))
            return 0;
        *x = (double)i;
        return 1;
    }
    if (v->kind != N_FLOAT)
        return 0;
    int ok;
    *x = token_double(s, v->len, &ok);
    if (!ok)
        PyErr_Clear();
    return ok;
}

static inline int two_digits(const unsigned char *s, int *v) {
    if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
        return 0;
    *v = (s[0] - '0') * 10 + (s[1] - '0');
    return 1;
}

static int64_t days_from_civil(int64_t y, int m, int d) { /* timestamps.py's, for years >= 0 */
    y -= m <= 2;
    int64_t era = y / 400, yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* PostgreSQL's microseconds of `YYYY-MM-DDTHH:MM:SS[.f{1,9}](Z|+HH:MM|-HH:MM)` in years
   1678..2261, as the Arrow path gets them (parse_rfc3339_ns's epoch nanoseconds, rounded
   half up to microseconds): 1; any other text: 0. */
static int timestamp_us(const unsigned char *s, Py_ssize_t n, int64_t *us) {
    static const int DAYS[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int c1, c2, mo, d, h, mi, se;
    if (n < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':')
        return 0;
    if (!two_digits(s, &c1) || !two_digits(s + 2, &c2) || !two_digits(s + 5, &mo) || !two_digits(s + 8, &d) ||
        !two_digits(s + 11, &h) || !two_digits(s + 14, &mi) || !two_digits(s + 17, &se))
        return 0;
    int y = c1 * 100 + c2;
    Py_ssize_t i = 19;
    int64_t frac = 0;
    if (s[i] == '.') {
        int digits = 0;
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++, digits++) {
            if (digits == 9)
                return 0;
            frac = frac * 10 + (s[i] - '0');
        }
        if (digits == 0)
            return 0;
        for (; digits < 9; digits++)
            frac *= 10;
    }
    int64_t offset = 0;
    if (i + 1 == n && s[i] == 'Z') {
        i++;
    } else if (i + 6 == n && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
        int oh, om;
        if (!two_digits(s + i + 1, &oh) || !two_digits(s + i + 4, &om) || oh > 23 || om > 59)
            return 0;
        offset = (int64_t)(oh * 3600 + om * 60) * (s[i] == '+' ? 1 : -1);
        i += 6;
    } else {
        return 0;
    }
    if (y < 1678 || y > 2261 || mo < 1 || mo > 12 || h > 23 || mi > 59 || se > 59)
        return 0;
    int leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    if (d < 1 || d > (mo == 2 && leap ? 29 : DAYS[mo - 1]))
        return 0;
    int64_t ns = (days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - offset) * 1000000000LL + frac;
    int64_t q = ns / 1000, r = ns % 1000;
    if (r < 0) { /* floor division, as numpy's // */
        q -= 1;
        r += 1000;
    }
    *us = q + (r >= 500) - PG_EPOCH_US;
    return 1;
}

/* One typed value into the row: 1; not sure: 0; Python error: -1. */
static int put_value(Scratch *cx, char kind, Py_ssize_t node, Py_ssize_t dim) {
    Node *v = &cx->nodes[node];
    const unsigned char *s = cx->line_bytes + v->start;
    switch (kind) {
    case 's': /* string -> text */
        if (v->kind != N_STR)
            return 0;
        if (v->plain)
            return put_bytes(cx, s, v->len) < 0 ? -1 : 1;
        if (ensure_text(cx, v->len) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t got = decode_string(s, v->len, cx->text);
        if (got < 0)
            return 0;
        return put_bytes(cx, cx->text, got) < 0 ? -1 : 1;
    case 'i': /* int -> integer */
    case 'l': { /* long -> bigint */
        int64_t x;
        if (v->kind != N_INT || !token_int(s, v->len, 18, &x))
            return 0;
        if (kind == 'l')
            return put_i64(cx, x) < 0 ? -1 : 1;
        if (x < INT32_MIN || x > INT32_MAX || row_reserve(cx, 8) < 0)
            return x < INT32_MIN || x > INT32_MAX ? 0 : -1;
        put_u32(cx, 4);
        put_u32(cx, (uint32_t)(int32_t)x);
        return 1;
    }
    case 'r': { /* real -> double precision */
        double x;
        if (!number_value(cx, v, &x))
            return 0;
        return put_f64(cx, x) < 0 ? -1 : 1;
    }
    case 'b': /* bool -> boolean */
        if (v->kind != N_TRUE && v->kind != N_FALSE)
            return 0;
        if (row_reserve(cx, 5) < 0)
            return -1;
        put_u32(cx, 1);
        cx->row[cx->n_row++] = v->kind == N_TRUE;
        return 1;
    case 't': { /* timestamp -> timestamp with time zone */
        int64_t us;
        if (v->kind != N_STR || !v->plain || !timestamp_us(s, v->len, &us))
            return 0;
        return put_i64(cx, us) < 0 ? -1 : 1;
    }
    case 'v': { /* vector(dim) -> real[] */
        if (v->kind != N_ARR || v->len != dim)
            return 0;
        if (row_reserve(cx, 4 + 20 + 8 * dim) < 0)
            return -1;
        put_u32(cx, (uint32_t)(20 + 8 * dim));
        put_u32(cx, 1);   /* dimensions */
        put_u32(cx, 0);   /* no nulls */
        put_u32(cx, 700); /* float4 */
        put_u32(cx, (uint32_t)dim);
        put_u32(cx, 1); /* lower bound */
        for (Py_ssize_t e = 0; e < dim; e++) {
            double x;
            if (!number_value(cx, &cx->nodes[cx->kids[v->start + e]], &x) || !(fabs(x) <= FLOAT32_LIMIT))
                return 0;
            float f = (float)x;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            put_u32(cx, 4);
            put_u32(cx, bits);
        }
        return 1;
    }
    default:
        return 0;
    }
}

/* ---- the plans: ScanPlan, DirectLayout, LineFacts, DirectWrite (coercion/native.py) -------
 *
 * Each entry point reads its plan by attribute name once per call, checking each attribute's
 * type and shape: a wrong or incomplete plan is a TypeError or ValueError naming the bad
 * attribute, never a crash. Every attribute read is kept alive in `held` (a list) for the
 * call, so the pointers below stay valid whatever Python code runs meanwhile. */

typedef struct {
    PyObject *plan; /* the DirectLayout: layouts map record types to it */
    PyObject *fields;
    const char *kinds, *need;
    Py_ssize_t ncols, emitted;
    Py_ssize_t *dims; /* per column (PyMem) */
} Layout;

typedef struct {
    PyObject *held; /* every attribute read: alive until the call ends */
    PyObject *shallow, *fixed_type, *layouts;
    PyObject *kinds, *records, *digests, *types, *ids, *tails; /* LineFacts: one entry per line */
    Layout *layout; /* the n_layouts layouts, read once (NULL: no direct facts) */
    Py_ssize_t n_layouts;
    const char *type_name, *id_name, *version_name;
    Py_ssize_t type_len, id_len, version_len;
} Scan;

/* obj.name, of `type` (or None if none_ok; any type if type is NULL), as a reference `held`
   keeps alive; NULL with a TypeError naming `owner.name` otherwise. */
static PyObject *plan_attr(PyObject *held, PyObject *obj, const char *owner, const char *name, PyTypeObject *type,
                           int none_ok) {
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s.%s is missing (%s is a %.100s)", owner, name, owner, Py_TYPE(obj)->tp_name);
        }
        return NULL;
    }
    if (!((none_ok && v == Py_None) || type == NULL || PyObject_TypeCheck(v, type))) {
        PyErr_Format(PyExc_TypeError, "%s.%s must be %s%s, not %.100s", owner, name, type->tp_name,
                     none_ok ? " or None" : "", Py_TYPE(v)->tp_name);
        Py_DECREF(v);
        return NULL;
    }
    int status = PyList_Append(held, v);
    Py_DECREF(v);
    return status < 0 ? NULL : v;
}

/* "owner['key']" into buf, for error messages. */
static void route_owner(char *buf, size_t size, const char *owner, PyObject *key) {
    const char *name_text = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (name_text == NULL)
        PyErr_Clear();
    snprintf(buf, size, "%s['%.80s']", owner, name_text ? name_text : "?");
}

static const char DIRECT_KINDS[] = "silrbtvd";

/* A layout's column shapes: as many kinds, required flags and dims as columns, every kind
   one the direct path writes, `emitted` its non-dynamic columns, every field's column an
   index (-1: an ignored field). */
static int check_layout(const char *owner, Layout *r, PyObject *kinds, PyObject *required, PyObject *dims) {
    r->ncols = PyBytes_GET_SIZE(kinds);
    if (PyBytes_GET_SIZE(required) != r->ncols || PyTuple_GET_SIZE(dims) != r->ncols) {
        PyErr_Format(PyExc_ValueError, "%s: kinds, required and dims must have one entry per column", owner);
        return -1;
    }
    if (r->ncols > MAX_DIRECT_COLUMNS) {
        PyErr_Format(PyExc_ValueError, "%s.kinds: more than %d columns", owner, MAX_DIRECT_COLUMNS);
        return -1;
    }
    r->kinds = PyBytes_AS_STRING(kinds);
    r->need = PyBytes_AS_STRING(required);
    r->dims = PyMem_Calloc((size_t)r->ncols + 1, sizeof(Py_ssize_t));
    if (r->dims == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t emitted = 0;
    for (Py_ssize_t c = 0; c < r->ncols; c++) {
        if (r->kinds[c] == '\0' || strchr(DIRECT_KINDS, r->kinds[c]) == NULL) {
            PyErr_Format(PyExc_ValueError, "%s.kinds[%zd]: not a kind the direct path writes", owner, c);
            return -1;
        }
        emitted += r->kinds[c] != 'd';
        PyObject *dim = PyTuple_GET_ITEM(dims, c);
        r->dims[c] = PyLong_Check(dim) ? PyLong_AsSsize_t(dim) : -1;
        if (r->dims[c] < 0 || r->dims[c] > 0xFFFFFF || (r->kinds[c] != 'v' && r->dims[c] != 0)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "%s.dims[%zd]: not a dimension of this column", owner, c);
            }
            return -1;
        }
    }
    if (emitted != r->emitted) {
        PyErr_Format(PyExc_ValueError, "%s.emitted is %zd; its kinds emit %zd columns", owner, r->emitted, emitted);
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *name, *at;
    while (PyDict_Next(r->fields, &pos, &name, &at)) {
        Py_ssize_t c = PyLong_Check(at) ? PyLong_AsSsize_t(at) : -2;
        if (!PyUnicode_Check(name) || c < -1 || c >= r->ncols) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s.fields: every field must map to a column index (or -1)", owner);
            return -1;
        }
    }
    return 0;
}

static int read_layout(PyObject *held, PyObject *key, PyObject *plan, Layout *r) {
    char owner[128];
    route_owner(owner, sizeof owner, "ScanPlan.layouts", key);
    r->plan = plan;
    PyObject *kinds, *required, *dims, *emitted;
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError, "%s: a record type must be a str, not %.100s", owner, Py_TYPE(key)->tp_name);
        return -1;
    }
    if (!(r->fields = plan_attr(held, plan, owner, "fields", &PyDict_Type, 0)) ||
        !(kinds = plan_attr(held, plan, owner, "kinds", &PyBytes_Type, 0)) ||
        !(required = plan_attr(held, plan, owner, "required", &PyBytes_Type, 0)) ||
        !(dims = plan_attr(held, plan, owner, "dims", &PyTuple_Type, 0)) ||
        !(emitted = plan_attr(held, plan, owner, "emitted", &PyLong_Type, 0)))
        return -1;
    r->emitted = PyLong_AsSsize_t(emitted);
    if (r->emitted == -1 && PyErr_Occurred())
        return -1;
    return check_layout(owner, r, kinds, required, dims);
}

/* A str-or-None attribute's UTF-8 (NULL for None); -1 on error. */
static int attr_text(PyObject *value, const char **utf8, Py_ssize_t *len) {
    *utf8 = NULL;
    *len = 0;
    if (value == Py_None)
        return 0;
    *utf8 = PyUnicode_AsUTF8AndSize(value, len);
    return *utf8 == NULL ? -1 : 0;
}

/* The LineFacts lists the call appends one entry per line to. */
static int read_facts(Scan *sc, PyObject *facts) {
    const char *owner = "LineFacts";
    PyObject *held = sc->held;
    if (!(sc->kinds = plan_attr(held, facts, owner, "kinds", &PyByteArray_Type, 0)) ||
        !(sc->records = plan_attr(held, facts, owner, "records", &PyList_Type, 0)) ||
        !(sc->digests = plan_attr(held, facts, owner, "digests", &PyList_Type, 0)) ||
        !(sc->types = plan_attr(held, facts, owner, "types", &PyList_Type, 0)) ||
        !(sc->ids = plan_attr(held, facts, owner, "ids", &PyList_Type, 0)) ||
        !(sc->tails = plan_attr(held, facts, owner, "tails", &PyList_Type, 0)))
        return -1;
    return 0;
}

static int read_scan(Scan *sc, PyObject *plan, PyObject *facts) {
    const char *owner = "ScanPlan";
    PyObject *held = sc->held, *tname, *iname, *vname;
    if (!(sc->shallow = plan_attr(held, plan, owner, "shallow", &PyFrozenSet_Type, 0)) ||
        !(sc->layouts = plan_attr(held, plan, owner, "layouts", &PyDict_Type, 1)) ||
        !(sc->fixed_type = plan_attr(held, plan, owner, "fixed_type", &PyUnicode_Type, 1)) ||
        !(tname = plan_attr(held, plan, owner, "type_field", &PyUnicode_Type, 1)) ||
        !(iname = plan_attr(held, plan, owner, "id_field", &PyUnicode_Type, 0)) ||
        !(vname = plan_attr(held, plan, owner, "version_field", &PyUnicode_Type, 1)) || read_facts(sc, facts) < 0)
        return -1;
    if (sc->fixed_type == Py_None && tname == Py_None) {
        PyErr_SetString(PyExc_ValueError, "ScanPlan: fixed_type and type_field are both None");
        return -1;
    }
    if (attr_text(tname, &sc->type_name, &sc->type_len) < 0 || attr_text(iname, &sc->id_name, &sc->id_len) < 0 ||
        attr_text(vname, &sc->version_name, &sc->version_len) < 0)
        return -1;
    if (sc->layouts == Py_None)
        return 0;
    sc->layout = PyMem_Calloc((size_t)PyDict_GET_SIZE(sc->layouts) + 1, sizeof(Layout));
    if (sc->layout == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(sc->layouts, &at, &key, &value))
        if (read_layout(held, key, value, &sc->layout[sc->n_layouts++]) < 0)
            return -1;
    return 0;
}

static void free_scan(Scan *sc) {
    for (Py_ssize_t r = 0; r < sc->n_layouts; r++)
        PyMem_Free(sc->layout[r].dims);
    PyMem_Free(sc->layout);
    Py_XDECREF(sc->held);
}

/* The layout of record_type, as read: NULL with no error if it has none. */
static Layout *find_layout(Scan *sc, PyObject *record_type) {
    PyObject *plan = PyDict_GetItemWithError(sc->layouts, record_type);
    for (Py_ssize_t r = 0; plan != NULL && r < sc->n_layouts; r++)
        if (sc->layout[r].plan == plan)
            return &sc->layout[r];
    if (plan != NULL)
        PyErr_SetString(PyExc_RuntimeError, "ScanPlan.layouts changed during the batch");
    return NULL;
}

static int same_key(Scratch *cx, Node *k, const char *name, Py_ssize_t len) {
    return name != NULL && k->len == len && memcmp(cx->line_bytes + k->start, name, (size_t)len) == 0;
}

/* The record's id and record-type nodes (-1: none), when its field names are all plain, it
   states no schema version and its id is a plain non-empty string: 1; else 0 (its facts are
   the whole record). */
static int direct_fields(Scratch *cx, Scan *sc, Node *obj, Py_ssize_t *type_node, Py_ssize_t *id_node) {
    *type_node = *id_node = -1;
    for (Py_ssize_t m = 0; m < obj->len; m++) {
        Node *k = &cx->nodes[cx->kids[obj->start + 2 * m]];
        if (!k->plain || same_key(cx, k, sc->version_name, sc->version_len))
            return 0;
        if (same_key(cx, k, sc->type_name, sc->type_len))
            *type_node = cx->kids[obj->start + 2 * m + 1];
        if (same_key(cx, k, sc->id_name, sc->id_len))
            *id_node = cx->kids[obj->start + 2 * m + 1];
    }
    Node *id = *id_node < 0 ? NULL : &cx->nodes[*id_node];
    return id != NULL && id->kind == N_STR && id->plain && id->len > 0;
}

/* Each column's value node (col_node, -1: missing), and in *unknown whether a field is not
   in the layout: 1; not sure: 0; -1 on a Python error. */
static int direct_columns(Scratch *cx, Layout *layout, Node *obj, int *unknown) {
    if (grow((void **)&cx->col_node, &cx->cap_col_node, layout->ncols + 1, sizeof(Py_ssize_t)) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t c = 0; c < layout->ncols; c++)
        cx->col_node[c] = -1;
    *unknown = 0;
    for (Py_ssize_t m = 0; m < obj->len; m++) {
        PyObject *name = key_of(cx, &cx->nodes[cx->kids[obj->start + 2 * m]]);
        if (name == NULL)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *at = PyDict_GetItemWithError(layout->fields, name);
        Py_DECREF(name);
        if (at == NULL) {
            if (PyErr_Occurred())
                return -1;
            *unknown = 1;
            continue;
        }
        Py_ssize_t c = PyLong_AsSsize_t(at);
        if (c == -1 && PyErr_Occurred())
            return -1;
        if (c >= 0 && c < layout->ncols)
            cx->col_node[c] = cx->kids[obj->start + 2 * m + 1];
    }
    return 1;
}

/* The typed columns (dynamic ones are PostgreSQL's, from _payload) into cx->row: 1; not
   sure: 0; -1. */
static int direct_typed(Scratch *cx, Layout *layout) {
    cx->n_row = 0;
    for (Py_ssize_t c = 0; c < layout->ncols; c++) {
        Py_ssize_t node = cx->col_node[c];
        char kind = layout->kinds[c];
        if (node < 0 || cx->nodes[node].kind == N_NULL) {
            if (layout->need[c])
                return 0; /* required: the converters word the reject */
            if (kind != 'd' && put_null(cx) < 0)
                return -1;
            continue;
        }
        if (kind == 'd')
            continue;
        int put = put_value(cx, kind, node, layout->dims[c]);
        if (put <= 0)
            return put;
    }
    return 1;
}

/* One line's facts, appended: kind, record, digest, type, id and typed tail. */
static int put_facts(Scan *sc, char kind, PyObject *record, PyObject *digest, PyObject *type, PyObject *id,
                     PyObject *tail) {
    int status = PyByteArray_Resize(sc->kinds, PyByteArray_GET_SIZE(sc->kinds) + 1);
    if (status == 0) {
        PyByteArray_AS_STRING(sc->kinds)[PyByteArray_GET_SIZE(sc->kinds) - 1] = kind;
        status = PyList_Append(sc->records, record ? record : Py_None) < 0 ||
                 PyList_Append(sc->digests, digest ? digest : Py_None) < 0 ||
                 PyList_Append(sc->types, type ? type : Py_None) < 0 || PyList_Append(sc->ids, id ? id : Py_None) < 0 ||
                 PyList_Append(sc->tails, tail ? tail : Py_None) < 0;
    }
    return status ? -1 : 0;
}

/* The record's type value and layout (routed by field, or the fixed one): 1; none: 0; -1. */
static int direct_type(Scratch *cx, Scan *sc, Py_ssize_t type_node, PyObject **type, Layout **layout) {
    *type = NULL;
    if (sc->fixed_type == Py_None) {
        if (type_node < 0 || cx->nodes[type_node].kind != N_STR)
            return 0;
        if ((*type = key_of(cx, &cx->nodes[type_node])) == NULL)
            return PyErr_Occurred() ? -1 : 0;
    }
    *layout = find_layout(sc, *type ? *type : sc->fixed_type);
    if (*layout == NULL) {
        Py_CLEAR(*type);
        return PyErr_Occurred() ? -1 : 0;
    }
    return 1;
}

/* The parsed line `top` as direct facts (its type, id, digest and typed columns, no Python
   record): 1 (appended); its facts need the record: 0; -1 on a Python error. */
static int direct_facts(Scratch *cx, Scan *sc, Py_ssize_t top, Py_ssize_t raw_len, const char hex[40]) {
    Node *obj = &cx->nodes[top];
    Py_ssize_t type_node, id_node;
    if (raw_len >= 0x7FFFFFFF || !direct_fields(cx, sc, obj, &type_node, &id_node))
        return 0;
    PyObject *type;
    Layout *layout;
    int unknown = 0, status = direct_type(cx, sc, type_node, &type, &layout);
    if (status > 0)
        status = direct_columns(cx, layout, obj, &unknown);
    if (status > 0)
        status = direct_typed(cx, layout);
    if (status <= 0) {
        Py_XDECREF(type);
        return status;
    }
    Node *id = &cx->nodes[id_node];
    PyObject *id_text = PyUnicode_DecodeASCII((const char *)cx->line_bytes + id->start, id->len, NULL);
    PyObject *digest = PyUnicode_FromStringAndSize(hex, 40);
    PyObject *tail = PyBytes_FromStringAndSize((const char *)cx->row, cx->n_row);
    status = id_text && digest && tail ? put_facts(sc, unknown ? 3 : 2, NULL, digest, type, id_text, tail) : -1;
    Py_XDECREF(type);
    Py_XDECREF(id_text);
    Py_XDECREF(digest);
    Py_XDECREF(tail);
    return status < 0 ? -1 : 1;
}

/* Line raw's facts: direct facts, the record and its digest, or kind 0 (the strict parser
   doubts it: the Python path parses it and words its reject, if any). 0, or -1. */
static int scan_one(Scratch *cx, Scan *sc, PyObject *raw) {
    if (!PyBytes_CheckExact(raw))
        return put_facts(sc, 0, NULL, NULL, NULL, NULL, NULL);
    char hex[40];
    Py_ssize_t top = parse_line(cx, (const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), hex);
    if (top < 0)
        return top == -1 ? -1 : put_facts(sc, 0, NULL, NULL, NULL, NULL, NULL);
    if (sc->layout != NULL) {
        int taken = direct_facts(cx, sc, top, PyBytes_GET_SIZE(raw), hex);
        if (taken != 0)
            return taken < 0 ? -1 : 0;
    }
    PyObject *record, *canonical, *digest;
    if (build_record(cx, top, hex, sc->shallow, &record, &canonical, &digest) < 0)
        return -1;
    int status = put_facts(sc, 1, record, digest, NULL, NULL, NULL);
    Py_DECREF(record);
    Py_DECREF(canonical);
    Py_DECREF(digest);
    return status;
}

PyDoc_STRVAR(scan_lines_doc,
             "scan_lines(raws: list, plan: ScanPlan, facts: LineFacts) -> None\n\n"
             "Each line's facts, appended to `facts` (see native.LineFacts): its record and the SHA-1\n"
             "of its canonical bytes; or, with plan.layouts, for a plain record, its type, id, SHA-1\n"
             "and typed COPY columns; or kind 0 where the strict parser doubts the line (None, for\n"
             "one). No rule is applied here: records.py decides every line from its facts.");

static PyObject *scan_lines(PyObject *self, PyObject *args) {
    PyObject *raws, *plan, *facts;
    if (!PyArg_ParseTuple(args, "O!OO:scan_lines", &PyList_Type, &raws, &plan, &facts))
        return NULL;
    Scan sc = {0};
    Scratch scratch = {0}, *cx = &scratch;
    PyObject *result = NULL;
    if ((sc.held = PyList_New(0)) == NULL || read_scan(&sc, plan, facts) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(raws); i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        Py_INCREF(raw); /* Python code may run (a collection's callbacks): the line stays ours */
        int status = scan_one(cx, &sc, raw);
        Py_DECREF(raw);
        if (status < 0)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    scratch_free(cx);
    free_scan(&sc);
    return result;
}

/* ---- direct rows: the COPY tuples of the rows records.py kept ---------------------- */

typedef struct {
    PyObject *held, *lines, *keys, *ids, *digests, *tails, *raws, *prefixes, *rows, *ends;
    const int64_t *pos, *offsets, *units;
    Py_ssize_t n_lines, emitted;
} Write;

/* One per-line column of a DirectWrite: a list as long as the batch. */
static PyObject *line_list(Write *w, PyObject *plan, const char *name) {
    PyObject *v = plan_attr(w->held, plan, "DirectWrite", name, &PyList_Type, 0);
    if (v != NULL && PyList_GET_SIZE(v) != w->n_lines) {
        PyErr_Format(PyExc_ValueError, "DirectWrite.%s needs one entry per line", name);
        return NULL;
    }
    return v;
}

static int read_write(Write *w, PyObject *plan) {
    const char *owner = "DirectWrite";
    PyObject *held = w->held, *pos, *offsets, *units, *emitted;
    if (!(w->raws = plan_attr(held, plan, owner, "raws", &PyList_Type, 0)))
        return -1;
    w->n_lines = PyList_GET_SIZE(w->raws);
    if (!(w->ids = line_list(w, plan, "ids")) || !(w->digests = line_list(w, plan, "digests")) ||
        !(w->tails = line_list(w, plan, "tails")) ||
        !(w->lines = plan_attr(held, plan, owner, "lines", &PyList_Type, 0)) ||
        !(w->keys = plan_attr(held, plan, owner, "keys", &PyList_Type, 0)) ||
        !(pos = plan_attr(held, plan, owner, "pos", &PyBytes_Type, 0)) ||
        !(offsets = plan_attr(held, plan, owner, "offsets", &PyBytes_Type, 0)) ||
        !(units = plan_attr(held, plan, owner, "units", &PyBytes_Type, 0)) ||
        !(w->prefixes = plan_attr(held, plan, owner, "prefixes", &PyList_Type, 0)) ||
        !(emitted = plan_attr(held, plan, owner, "emitted", &PyLong_Type, 0)) ||
        !(w->rows = plan_attr(held, plan, owner, "rows", &PyByteArray_Type, 0)) ||
        !(w->ends = plan_attr(held, plan, owner, "ends", &PyList_Type, 0)))
        return -1;
    Py_ssize_t n = w->n_lines * 8;
    if (PyBytes_GET_SIZE(pos) != n || PyBytes_GET_SIZE(offsets) != n || PyBytes_GET_SIZE(units) != n) {
        PyErr_SetString(PyExc_ValueError, "DirectWrite: pos, offsets and units need one int64 per line");
        return -1;
    }
    if (PyList_GET_SIZE(w->keys) != PyList_GET_SIZE(w->lines)) {
        PyErr_SetString(PyExc_ValueError, "DirectWrite: keys needs one key per line written");
        return -1;
    }
    w->pos = (const int64_t *)PyBytes_AS_STRING(pos);
    w->offsets = (const int64_t *)PyBytes_AS_STRING(offsets);
    w->units = (const int64_t *)PyBytes_AS_STRING(units);
    w->emitted = PyLong_AsSsize_t(emitted);
    if (w->emitted < 0 || w->emitted > MAX_DIRECT_COLUMNS) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "DirectWrite.emitted: not a column count");
        return -1;
    }
    return 0;
}

/* Line `at`'s values, checked: raw (bytes), id and key (str), digest (40 characters), tail
   (bytes) and its unit's prefix (bytes). 0, or -1 with a ValueError. */
static int row_values(Write *w, Py_ssize_t k, Py_ssize_t *at, PyObject **prefix) {
    PyObject *line = PyList_GET_ITEM(w->lines, k);
    *at = PyLong_Check(line) ? PyLong_AsSsize_t(line) : -1;
    if (*at < 0 || *at >= w->n_lines) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "DirectWrite.lines[%zd]: not a line of the batch", k);
        return -1;
    }
    int64_t unit = w->units[*at];
    PyObject *raw = PyList_GET_ITEM(w->raws, *at), *digest = PyList_GET_ITEM(w->digests, *at);
    *prefix = unit >= 0 && unit < PyList_GET_SIZE(w->prefixes) ? PyList_GET_ITEM(w->prefixes, unit) : NULL;
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) >= 0x7FFFFFFF || !PyUnicode_Check(PyList_GET_ITEM(w->ids, *at)) ||
        !PyUnicode_Check(digest) || PyUnicode_GET_LENGTH(digest) != 40 ||
        !PyBytes_Check(PyList_GET_ITEM(w->tails, *at)) || !PyUnicode_Check(PyList_GET_ITEM(w->keys, k)) ||
        *prefix == NULL || !PyBytes_Check(*prefix)) {
        PyErr_Format(PyExc_ValueError, "DirectWrite: line %zd has no direct facts (or its unit no prefix)", *at);
        return -1;
    }
    return 0;
}

/* A str's UTF-8 as a COPY field. */
static int put_text(Scratch *cx, PyObject *text) {
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
    return utf8 == NULL ? -1 : put_bytes(cx, utf8, len);
}

/* Line `at`'s COPY tuple into cx->row: the field count, the 11 staged system columns, then
   its typed columns (the tail scan_lines wrote). 0, or -1. */
static int copy_row(Scratch *cx, Write *w, Py_ssize_t at, PyObject *key, PyObject *prefix) {
    PyObject *raw = PyList_GET_ITEM(w->raws, at), *tail = PyList_GET_ITEM(w->tails, at);
    cx->n_row = 0;
    char number[24];
    int digits = snprintf(number, sizeof number, "%lld", (long long)w->offsets[at]);
    Py_ssize_t raw_len = PyBytes_GET_SIZE(raw), prefix_len = PyBytes_GET_SIZE(prefix);
    if (row_reserve(cx, 2) < 0)
        return -1;
    put_u16(cx, (uint16_t)(11 + w->emitted));
    if (put_i64(cx, w->pos[at]) < 0 || put_text(cx, key) < 0 || put_text(cx, PyList_GET_ITEM(w->ids, at)) < 0 ||
        put_text(cx, PyList_GET_ITEM(w->digests, at)) < 0 ||
        row_reserve(cx, 4 + prefix_len + digits + 5 + raw_len + 5 * 4 + PyBytes_GET_SIZE(tail)) < 0)
        return -1;
    put_u32(cx, (uint32_t)(prefix_len + digits)); /* _source */
    memcpy(cx->row + cx->n_row, PyBytes_AS_STRING(prefix), (size_t)prefix_len);
    cx->n_row += prefix_len;
    memcpy(cx->row + cx->n_row, number, (size_t)digits);
    cx->n_row += digits;
    /* _payload: jsonb version 1, then the line as received (DESIGN 4: PostgreSQL reads its
       numbers as numeric, exactly; the canonical text's went through doubles). A line end or
       other JSON whitespace in it is whitespace to jsonb too. */
    put_u32(cx, (uint32_t)(1 + raw_len));
    cx->row[cx->n_row++] = 1;
    memcpy(cx->row + cx->n_row, PyBytes_AS_STRING(raw), (size_t)raw_len);
    cx->n_row += raw_len;
    for (int c = 0; c < 5; c++) /* _extra, _props, _meta, _version, _upgraded */
        put_u32(cx, 0xFFFFFFFFu);
    memcpy(cx->row + cx->n_row, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
    cx->n_row += PyBytes_GET_SIZE(tail);
    return 0;
}

PyDoc_STRVAR(write_direct_doc,
             "write_direct(plan: DirectWrite) -> None\n\n"
             "The COPY tuples of plan.lines (lines scan_lines gave direct facts, kept by records.py\n"
             "with plan.keys), appended to plan.rows, each one's end to plan.ends.");

static PyObject *write_direct(PyObject *self, PyObject *args) {
    PyObject *plan;
    if (!PyArg_ParseTuple(args, "O:write_direct", &plan))
        return NULL;
    Write w = {0};
    Scratch scratch = {0}, *cx = &scratch;
    PyObject *result = NULL;
    if ((w.held = PyList_New(0)) == NULL || read_write(&w, plan) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(w.lines) && k < PyList_GET_SIZE(w.keys); k++) {
        Py_ssize_t at;
        PyObject *prefix;
        if (row_values(&w, k, &at, &prefix) < 0 || copy_row(cx, &w, at, PyList_GET_ITEM(w.keys, k), prefix) < 0)
            goto done;
        Py_ssize_t had = PyByteArray_GET_SIZE(w.rows);
        if (PyByteArray_Resize(w.rows, had + cx->n_row) < 0)
            goto done;
        memcpy(PyByteArray_AS_STRING(w.rows) + had, cx->row, (size_t)cx->n_row);
        if (append_steal(w.ends, PyLong_FromSsize_t(had + cx->n_row)) < 0)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    scratch_free(cx);
    Py_XDECREF(w.held);
    return result;
}

PyDoc_STRVAR(columns_doc,
             "columns(records: list[dict], names: tuple[str, ...]) -> list[list]\n\n"
             "Per name, its value in every record (None where a record lacks it): what\n"
             "[list(map(dict.get, records, repeat(name))) for name in names] gives, in one\n"
             "pass over the records (each record's dict is read while it is in cache).");

static PyObject *columns(PyObject *self, PyObject *args) {
    PyObject *records, *names;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &records, &PyTuple_Type, &names))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), k = PyTuple_GET_SIZE(names);
    PyObject *result = PyList_New(k);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t c = 0; c < k; c++) {
        PyObject *values = PyList_New(n);
        if (values == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, c, values);
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *record = PyList_GET_ITEM(records, r);
        if (!PyDict_Check(record)) {
            Py_DECREF(result);
            PyErr_SetString(PyExc_TypeError, "columns: every record must be a dict");
            return NULL;
        }
        for (Py_ssize_t c = 0; c < k; c++) {
            PyObject *value = PyDict_GetItemWithError(record, PyTuple_GET_ITEM(names, c));
            if (value == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(result);
                    return NULL;
                }
                value = Py_None;
            }
            Py_INCREF(value);
            PyList_SET_ITEM(PyList_GET_ITEM(result, c), r, value);
        }
    }
    return result;
}

PyDoc_STRVAR(gather_doc,
             "gather(data: bytes | bytearray, ends: list[int], order: list[int]) -> bytes\n\n"
             "The pieces of data named by order (0-based), one after another: piece i is\n"
             "data[ends[i - 1]:ends[i]] (from 0 for i == 0). What b\"\".join of those slices gives,\n"
             "without a memoryview object per piece: the executors sort each batch's COPY tuples\n"
             "by key this way (write/staging.py, in_key_order).");

static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *ends, *order, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*O!O!:gather", &data, &PyList_Type, &ends, &PyList_Type, &order))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ends), k = PyList_GET_SIZE(order), total = 0;
    Py_ssize_t *starts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(k ? k : 1));
    Py_ssize_t *sizes = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(k ? k : 1));
    if (starts == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(order, j));
        if (i == -1 && PyErr_Occurred())
            goto done;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "gather: order[%zd] = %zd is not a piece of %zd", j, i, n);
            goto done;
        }
        Py_ssize_t start = i ? PyLong_AsSsize_t(PyList_GET_ITEM(ends, i - 1)) : 0;
        Py_ssize_t end = PyLong_AsSsize_t(PyList_GET_ITEM(ends, i));
        if (PyErr_Occurred())
            goto done;
        if (start < 0 || end < start || end > data.len) {
            PyErr_Format(PyExc_ValueError, "gather: piece %zd spans [%zd, %zd) of %zd bytes", i, start, end, data.len);
            goto done;
        }
        starts[j] = start;
        sizes[j] = end - start;
        total += end - start;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        goto done;
    char *out = PyBytes_AS_STRING(result);
    for (Py_ssize_t j = 0; j < k; j++) {
        memcpy(out, (const char *)data.buf + starts[j], (size_t)sizes[j]);
        out += sizes[j];
    }
done:
    PyMem_Free(starts);
    PyMem_Free(sizes);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"canonical_line", canonical_line, METH_VARARGS, canonical_line_doc},
    {"scan_lines", scan_lines, METH_VARARGS, scan_lines_doc},
    {"write_direct", write_direct, METH_VARARGS, write_direct_doc},
    {"columns", columns, METH_VARARGS, columns_doc},
    {"gather", gather, METH_VARARGS, gather_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "A JSON line to its canonical bytes, SHA-1 and values in C (see idem_platform.coercion.native).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    init_special();
    return PyModule_Create(&module);
}
