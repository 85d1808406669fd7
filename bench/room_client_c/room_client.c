/* The room subscriber process of bench.room_bench in C: a drop-in for
 * bench/room_client.py (kinds "ours" and "ws"), started through
 * bench/room_client_c.py, which computes every socket's request target and execs
 * this program with a file of them:
 *
 *   room_client --file F --kind ours|ws --n-urls N --concurrency C --max-seconds S
 *
 * F: one line per socket, "url_index host port path sampled" (deleted once read).
 * One thread, epoll (level-triggered), non-blocking sockets; per socket only a
 * struct and, while a frame spans reads, a buffer for its bytes. The HTTP/1.1
 * upgrade uses the fixed key of RFC 6455 1.3 (the accept is checked); client
 * frames are masked (RFC 6455 5.3). Counting, the latency histogram and the
 * JSON lines on stdin/stdout are those of room_client.py's Stats / Conn / serve.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LOG_BUCKETS 200
#define HIST_MAX 8192
#define TRIES 4
#define ATTEMPT_TIMEOUT 30.0
#define RBUF (256 * 1024)
#define MAX_OTHER 256
#define STDIN_ID 0xFFFFFFFFu

static const char WS_KEY[] = "dGhlIHNhbXBsZSBub25jZQ==";      /* RFC 6455 1.3 */
static const char WS_ACCEPT[] = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="; /* its accept */
static const char JOIN[] = "{\"op\":\"join\",\"id\":1,\"room\":\"r1\"}";

enum { S_IDLE, S_CONNECTING, S_UPGRADING, S_JOINING, S_WAIT, S_READY, S_DEAD };

typedef struct {
    int fd, url, port, sampled, state, tries, connected;
    char *host, *path;
    double deadline; /* of the attempt (S_CONNECTING..S_JOINING) or of the retry wait */
    long long got;
    unsigned char *pend; size_t plen, pcap; /* bytes of an incomplete frame / head */
    unsigned char *frag; size_t flen, fcap; /* a fragmented message */
} conn_t;

static conn_t *conns;
static int n_conns, n_urls = 1, concurrency = 64, epfd, dump_left;
static double max_seconds = 3600;
static long poll_us = 0; /* > 0: once ready, poll every poll_us instead of sleeping in epoll_wait */
static unsigned char rbuf[RBUF];
static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* -- the phase's counts (Stats) -------------------------------------------------- */
static char marker[256] = "~none~";
static char mpat[300]; /* "m":"<marker>" */
static size_t marker_len = 6, mpat_len;
static double open_t, close_t, lat_max;
static long long total, win, frames_win, *url_win, hist[HIST_MAX];
static struct { char *key; long long n; } other[MAX_OTHER];
static int n_other;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) { fprintf(stderr, "room_client: out of memory\n"); exit(2); }
    return q;
}

static void other_add(const char *key) {
    for (int i = 0; i < n_other; i++)
        if (!strcmp(other[i].key, key)) { other[i].n++; return; }
    if (n_other == MAX_OTHER) key = "(more kinds)";
    for (int i = 0; i < n_other; i++)
        if (!strcmp(other[i].key, key)) { other[i].n++; return; }
    other[n_other].key = strdup(key);
    other[n_other++].n = 1;
}

static void reset(const char *m, double o, double c) {
    snprintf(marker, sizeof marker, "%s", m);
    marker_len = strlen(marker);
    mpat_len = (size_t)snprintf(mpat, sizeof mpat, "\"m\":\"%s\"", marker);
    open_t = o; close_t = c;
    total = win = frames_win = 0;
    memset(url_win, 0, sizeof(long long) * (size_t)n_urls);
    memset(hist, 0, sizeof hist);
    lat_max = 0.0;
}

static void latency(double seconds) {
    double us = seconds * 1e6;
    long i = us > 1 ? (long)(log(us) * LOG_BUCKETS) : 0;
    if (i < 0) i = 0;
    if (i >= HIST_MAX) i = HIST_MAX - 1;
    hist[i]++;
    if (seconds > lat_max) lat_max = seconds;
}

/* -- output ----------------------------------------------------------------------- */
typedef struct { char *b; size_t n, cap; } sbuf;

#define SB_LIT(s, lit) sb_add((s), (lit), sizeof(lit) - 1)

static void sb_add(sbuf *s, const char *p, size_t n) {
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->b = xrealloc(s->b, s->cap);
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
    s->b[s->n] = 0;
}

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof tmp - 1) n = (int)sizeof tmp - 1;
    if (n > 0) sb_add(s, tmp, (size_t)n);
}

static void sb_jstr(sbuf *s, const char *p) { /* a JSON string */
    SB_LIT(s, "\"");
    for (; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"' || ch == '\\') { SB_LIT(s, "\\"); sb_add(s, p, 1); }
        else if (ch < 0x20 || ch >= 0x7f) sb_printf(s, "\\u%04x", ch);
        else sb_add(s, p, 1);
    }
    SB_LIT(s, "\"");
}

static void sb_float(sbuf *s, double v) { /* as a JSON float (Python's 0.0, not 0) */
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.17g", v);
    sb_add(s, tmp, strlen(tmp));
    if (!strpbrk(tmp, ".eEn")) SB_LIT(s, ".0");
}

static void pyrepr(sbuf *s, const unsigned char *p, size_t n) { /* Python's bytes repr */
    int sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    SB_LIT(s, "b");
    sb_add(s, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = p[i];
        if (ch == (unsigned char)q || ch == '\\') { SB_LIT(s, "\\"); sb_add(s, (char *)&ch, 1); }
        else if (ch == '\t') SB_LIT(s, "\\t");
        else if (ch == '\n') SB_LIT(s, "\\n");
        else if (ch == '\r') SB_LIT(s, "\\r");
        else if (ch < 0x20 || ch >= 0x7f) sb_printf(s, "\\x%02x", ch);
        else sb_add(s, (char *)&ch, 1);
    }
    sb_add(s, &q, 1);
}

static void emit(sbuf *s) {
    SB_LIT(s, "\n");
    size_t off = 0;
    while (off < s->n) {
        ssize_t w = write(1, s->b + off, s->n - off);
        if (w < 0) { if (errno == EINTR) continue; exit(3); }
        off += (size_t)w;
    }
    free(s->b);
}

static void other_json(sbuf *s) {
    SB_LIT(s, "{");
    for (int i = 0; i < n_other; i++) {
        if (i) SB_LIT(s, ",");
        sb_jstr(s, other[i].key);
        sb_printf(s, ":%lld", other[i].n);
    }
    SB_LIT(s, "}");
}

static void failed(const char *error) {
    sbuf s = {0};
    SB_LIT(&s, "{\"ev\":\"failed\",\"error\":");
    char e[501];
    snprintf(e, sizeof e, "%s", error);
    sb_jstr(&s, e);
    SB_LIT(&s, ",\"other\":");
    other_json(&s);
    SB_LIT(&s, "}");
    fprintf(stderr, "room_client: %s\n", e);
    emit(&s);
    exit(0); /* as room_client.py: the failure is the answer */
}

/* -- sockets ---------------------------------------------------------------------- */
static void ws_send(conn_t *c, int op, const void *data, size_t n) {
    unsigned char buf[256 + 14];
    size_t h = 2;
    if (c->fd < 0 || n > 256) return;
    buf[0] = (unsigned char)(0x80 | op);
    if (n < 126) buf[1] = (unsigned char)(0x80 | n);
    else { buf[1] = 0x80 | 126; buf[2] = (unsigned char)(n >> 8); buf[3] = (unsigned char)n; h = 4; }
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    unsigned char *mask = buf + h;
    memcpy(mask, &rng, 4);
    h += 4;
    for (size_t i = 0; i < n; i++) buf[h + i] = ((const unsigned char *)data)[i] ^ mask[i & 3];
    ssize_t w = write(c->fd, buf, h + n);
    if (w != (ssize_t)(h + n)) other_add("send incomplete");
}

static void close_fd(conn_t *c) {
    if (c->fd >= 0) { close(c->fd); c->fd = -1; }
    c->plen = c->flen = 0;
}

static void attempt_failed(conn_t *c, const char *why, double now) {
    if (c->connected) other_add("socket closed"); /* on_lost, as the Python socket */
    close_fd(c);
    c->connected = 0;
    c->tries++;
    if (c->tries >= TRIES) {
        char e[600];
        snprintf(e, sizeof e, "ConnectionError('%s:%d: %s (%d tries)')", c->host, c->port, why,
                 c->tries);
        failed(e);
    }
    other_add("connect retried");
    c->state = S_WAIT;
    c->deadline = now + 0.2 * c->tries;
}

static void lost(conn_t *c, double now) {
    if (c->state == S_READY) {
        other_add("socket closed");
        close_fd(c);
        c->state = S_DEAD;
    } else if (c->state != S_DEAD) {
        attempt_failed(c, "closed before it was ready", now);
    }
}

static int n_ready, in_flight;

static void start(conn_t *c, double now) {
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)c->port);
    if (inet_pton(AF_INET, strcmp(c->host, "localhost") ? c->host : "127.0.0.1",
                  &sa.sin_addr) != 1) {
        c->tries = TRIES - 1;
        attempt_failed(c, "not an IPv4 address", now);
    }
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) { attempt_failed(c, strerror(errno), now); return; }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = S_CONNECTING;
    c->deadline = now + ATTEMPT_TIMEOUT;
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        attempt_failed(c, strerror(errno), now);
        return;
    }
    struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = (uint32_t)(c - conns)};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) attempt_failed(c, strerror(errno), now);
}

static void on_writable(conn_t *c, double now) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err) { attempt_failed(c, strerror(err), now); return; }
    c->connected = 1;
    char req[4096];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n", c->path, c->host, c->port, WS_KEY);
    if (n <= 0 || n >= (int)sizeof req || write(c->fd, req, (size_t)n) != n) {
        attempt_failed(c, "request not written", now);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)(c - conns)};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->state = S_UPGRADING;
}

/* -- frames ----------------------------------------------------------------------- */
/* the string or bare value of "key": in p[0:n] (first occurrence), into out */
static int json_field(const unsigned char *p, size_t n, const char *key, char *out, size_t cap) {
    const unsigned char *f = memmem(p, n, key, strlen(key)), *end = p + n;
    if (!f) return 0;
    f += strlen(key);
    while (f < end && *f == ' ') f++;
    size_t k = 0;
    if (f < end && *f == '"') {
        for (f++; f < end && *f != '"' && k + 1 < cap; f++) out[k++] = (char)*f;
    } else {
        for (; f < end && !strchr(",}] ", *f) && k + 1 < cap; f++) out[k++] = (char)*f;
    }
    out[k] = 0;
    return 1;
}

static void set_ready(conn_t *c) {
    c->state = S_READY;
    n_ready++;
    in_flight--;
}

static void control(conn_t *c, const unsigned char *p, size_t n, double now) {
    char op[64] = "None", re[32] = "", code[128] = "";
    int has_op = json_field(p, n, "\"op\":", op, sizeof op);
    int has_re = json_field(p, n, "\"re\":", re, sizeof re) && strcmp(re, "null");
    json_field(p, n, "\"code\":", code, sizeof code);
    if (!has_op) snprintf(op, sizeof op, "None");
    int re1 = has_re && !strcmp(re, "1"), is_err = !strcmp(op, "error");
    if (!strcmp(op, "joined") && re1) {
        if (c->state == S_JOINING) set_ready(c);
    } else if (is_err && re1) {
        if (c->state == S_JOINING) {
            sbuf s = {0};
            SB_LIT(&s, "join refused: ");
            pyrepr(&s, p, n < 200 ? n : 200);
            attempt_failed(c, s.b, now);
            free(s.b);
        }
    } else if ((!strcmp(op, "ok") || is_err) && has_re) {
        /* a reply to the publisher's sends: not a subscriber's */
    } else if (strcmp(op, "room_msgs")) { /* room_msgs of another phase: late, not counted */
        char key[256];
        snprintf(key, sizeof key, "%s:%s", op, code);
        other_add(key);
    }
}

static void on_text(conn_t *c, const unsigned char *p, size_t n, double now) {
    long long k = 0;
    const unsigned char *q = p, *end = p + n;
    while ((q = memmem(q, (size_t)(end - q), marker, marker_len)) != NULL) { k++; q += marker_len; }
    if (dump_left > 0 && (k || c->state == S_READY)) { /* ROOM_CLIENT_C_DUMP=n: debugging */
        dump_left--;
        fprintf(stderr, "frame %zu B, %lld of the phase: %.*s\n", n, k, (int)(n < 600 ? n : 600),
                (const char *)p);
    }
    if (!k) { control(c, p, n, now); return; }
    c->got += k;
    total += k;
    if (open_t <= now && now < close_t) {
        win += k;
        frames_win++;
        url_win[c->url] += k;
        if (c->sampled) { /* each body whose "m" is the marker: its "t" */
            q = p;
            while ((q = memmem(q, (size_t)(end - q), mpat, mpat_len)) != NULL) {
                const unsigned char *a = q, *b = q + mpat_len;
                while (a > p && *a != '{') a--;
                while (b < end && *b != '}') b++;
                const unsigned char *t = memmem(a, (size_t)(b - a), "\"t\":", 4);
                q += mpat_len;
                if (!t) { other_add("body without t"); continue; }
                char num[64];
                size_t len = 0;
                for (t += 4; t < b && len + 1 < sizeof num && strchr("0123456789.eE+- ", *t); t++)
                    num[len++] = (char)*t;
                num[len] = 0;
                char *stop;
                double sent = strtod(num, &stop);
                if (stop == num) { other_add("body with a bad t"); continue; }
                latency(now - sent);
            }
        }
    }
}

/* one frame; 0 once the socket is gone */
static int frame(conn_t *c, unsigned b0, unsigned char *p, size_t n, double now) {
    unsigned op = b0 & 0x0F;
    if (op <= 2) {
        if (!(b0 & 0x80)) {
            if (c->flen + n > c->fcap) { c->fcap = (c->flen + n) * 2; c->frag = xrealloc(c->frag, c->fcap); }
            memcpy(c->frag + c->flen, p, n);
            c->flen += n;
            return 1;
        }
        if (c->flen) {
            if (c->flen + n > c->fcap) { c->fcap = (c->flen + n) * 2; c->frag = xrealloc(c->frag, c->fcap); }
            memcpy(c->frag + c->flen, p, n);
            size_t len = c->flen + n;
            c->flen = 0;
            on_text(c, c->frag, len, now);
        } else {
            on_text(c, p, n, now);
        }
    } else if (op == 9) {
        ws_send(c, 10, p, n);
    } else if (op == 8) {
        sbuf s = {0};
        SB_LIT(&s, "close frame ");
        for (size_t i = 0; i < n && i < 2; i++) sb_printf(&s, "%02x", p[i]);
        SB_LIT(&s, " ");
        pyrepr(&s, n > 2 ? p + 2 : p, n > 2 ? (n < 60 ? n : 60) - 2 : 0);
        other_add(s.b);
        free(s.b);
        ws_send(c, 8, p, n < 2 ? n : 2);
        lost(c, now);
        return 0;
    }
    return c->fd >= 0;
}

/* parse data[0:n]; returns the bytes used, or -1 once the socket is gone */
static long parse(conn_t *c, unsigned char *data, size_t n, double now) {
    size_t pos = 0;
    if (c->state == S_UPGRADING) {
        unsigned char *end = memmem(data, n, "\r\n\r\n", 4);
        if (!end) {
            if (n > 65536) { attempt_failed(c, "response head too long", now); return -1; }
            return 0;
        }
        size_t hl = (size_t)(end - data);
        if (hl < 12 || memcmp(data, "HTTP/1.1 101", 12) || !memmem(data, hl, WS_ACCEPT, strlen(WS_ACCEPT))) {
            sbuf s = {0};
            SB_LIT(&s, "upgrade refused: ");
            pyrepr(&s, data, n < 300 ? n : 300);
            attempt_failed(c, s.b, now);
            free(s.b);
            return -1;
        }
        pos = hl + 4;
        c->state = S_JOINING;
        ws_send(c, 1, JOIN, strlen(JOIN));
    }
    while (n - pos >= 2) {
        unsigned b0 = data[pos], b1 = data[pos + 1];
        uint64_t len = b1 & 0x7F;
        size_t hdr = 2;
        if (len == 126) {
            if (n - pos < 4) break;
            len = ((uint64_t)data[pos + 2] << 8) | data[pos + 3];
            hdr = 4;
        } else if (len == 127) {
            if (n - pos < 10) break;
            len = 0;
            for (int i = 0; i < 8; i++) len = (len << 8) | data[pos + 2 + i];
            hdr = 10;
        }
        size_t mhdr = hdr + ((b1 & 0x80) ? 4 : 0);
        if (len > (uint64_t)1 << 40 || n - pos < mhdr || n - pos - mhdr < len) break;
        unsigned char *payload = data + pos + mhdr;
        if (b1 & 0x80) /* servers do not mask (RFC 6455 5.1); undo it anyway */
            for (size_t i = 0; i < len; i++) payload[i] ^= data[pos + hdr + (i & 3)];
        pos += mhdr + (size_t)len;
        if (!frame(c, b0, payload, (size_t)len, now)) return -1;
    }
    return (long)pos;
}

static void on_readable(conn_t *c) {
    ssize_t r = read(c->fd, rbuf, RBUF);
    double now = now_s();
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) { lost(c, now); return; }
    unsigned char *data = rbuf;
    size_t n = (size_t)r;
    if (c->plen) {
        if (c->plen + n > c->pcap) { c->pcap = (c->plen + n) * 2; c->pend = xrealloc(c->pend, c->pcap); }
        memcpy(c->pend + c->plen, rbuf, n);
        c->plen += n;
        data = c->pend;
        n = c->plen;
    }
    long used = parse(c, data, n, now);
    if (used < 0) return;
    size_t rest = n - (size_t)used;
    if (data == c->pend) {
        memmove(c->pend, c->pend + used, rest);
        c->plen = rest;
    } else if (rest) {
        if (rest > c->pcap) { c->pcap = rest * 2; c->pend = xrealloc(c->pend, c->pcap); }
        memcpy(c->pend, data + used, rest);
        c->plen = rest;
    }
}

/* -- commands --------------------------------------------------------------------- */
static void quit_all(void) {
    static const unsigned char bye[2] = {0x03, 0xe8};
    for (int i = 0; i < n_conns; i++) {
        if (conns[i].fd >= 0) { ws_send(&conns[i], 8, bye, 2); close(conns[i].fd); }
    }
    exit(0);
}

static void command(char *line) {
    char cmd[32] = "";
    json_field((unsigned char *)line, strlen(line), "\"cmd\":", cmd, sizeof cmd);
    if (!strcmp(cmd, "phase")) {
        char m[256] = "", o[64] = "0", cl[64] = "0";
        json_field((unsigned char *)line, strlen(line), "\"marker\":", m, sizeof m);
        json_field((unsigned char *)line, strlen(line), "\"open\":", o, sizeof o);
        json_field((unsigned char *)line, strlen(line), "\"close\":", cl, sizeof cl);
        reset(m, strtod(o, NULL), strtod(cl, NULL));
        for (int i = 0; i < n_conns; i++) conns[i].got = 0;
        sbuf s = {0};
        SB_LIT(&s, "{\"ev\":\"ok\"}");
        emit(&s);
    } else if (!strcmp(cmd, "stats")) {
        long long gmin = conns[0].got, gmax = conns[0].got, shrt = 0, closed = 0;
        for (int i = 0; i < n_conns; i++) {
            if (conns[i].got < gmin) gmin = conns[i].got;
            if (conns[i].got > gmax) gmax = conns[i].got;
            closed += conns[i].state == S_DEAD;
        }
        for (int i = 0; i < n_conns; i++) shrt += conns[i].got < gmax;
        sbuf s = {0};
        sb_printf(&s, "{\"ev\":\"stats\",\"total\":%lld,\"win\":%lld,\"frames_win\":%lld,\"url_win\":[",
                  total, win, frames_win);
        for (int i = 0; i < n_urls; i++) sb_printf(&s, "%s%lld", i ? "," : "", url_win[i]);
        SB_LIT(&s, "],\"hist\":{");
        int first = 1;
        for (int i = 0; i < HIST_MAX; i++)
            if (hist[i]) { sb_printf(&s, "%s\"%d\":%lld", first ? "" : ",", i, hist[i]); first = 0; }
        SB_LIT(&s, "},\"lat_max\":");
        sb_float(&s, lat_max);
        SB_LIT(&s, ",\"other\":");
        other_json(&s);
        sb_printf(&s, ",\"got_min\":%lld,\"got_max\":%lld,\"short\":%lld,\"closed\":%lld}",
                  gmin, gmax, shrt, closed);
        emit(&s);
    } else if (!strcmp(cmd, "quit")) {
        quit_all();
    } else {
        other_add("unknown command");
    }
}

static char *lbuf;
static size_t llen, lcap;

static void on_stdin(void) {
    char tmp[65536];
    ssize_t r = read(0, tmp, sizeof tmp);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) quit_all(); /* EOF: the benchmark went away */
    if (llen + (size_t)r + 1 > lcap) { lcap = (llen + (size_t)r + 1) * 2; lbuf = xrealloc(lbuf, lcap); }
    memcpy(lbuf + llen, tmp, (size_t)r);
    llen += (size_t)r;
    char *nl;
    while ((nl = memchr(lbuf, '\n', llen)) != NULL) {
        *nl = 0;
        command(lbuf);
        size_t used = (size_t)(nl - lbuf) + 1;
        memmove(lbuf, nl + 1, llen - used);
        llen -= used;
    }
}

/* -- main ------------------------------------------------------------------------- */
static void load(const char *file) {
    FILE *f = fopen(file, "r");
    if (!f) { fprintf(stderr, "room_client: %s: %s\n", file, strerror(errno)); exit(2); }
    char host[256], path[8192];
    int url, port, sampled, cap = 0;
    while (fscanf(f, "%d %255s %d %8191s %d", &url, host, &port, path, &sampled) == 5) {
        if (n_conns == cap) { cap = cap ? cap * 2 : 1024; conns = xrealloc(conns, sizeof *conns * (size_t)cap); }
        conn_t *c = &conns[n_conns++];
        memset(c, 0, sizeof *c);
        c->fd = -1;
        c->url = url < n_urls && url >= 0 ? url : 0;
        c->port = port;
        c->sampled = sampled;
        c->host = strdup(host);
        c->path = strdup(path);
    }
    fclose(f);
    unlink(file);
}

int main(int argc, char **argv) {
    const char *file = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--file")) file = argv[i + 1];
        else if (!strcmp(argv[i], "--n-urls")) n_urls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--concurrency")) concurrency = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-seconds")) max_seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--poll-us")) poll_us = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--kind")) { /* ours and ws: the same subset */ }
        else { fprintf(stderr, "room_client: unknown option %s\n", argv[i]); return 2; }
    }
    if (!file || n_urls < 1 || concurrency < 1) {
        fprintf(stderr, "usage: room_client --file F [--kind K] [--n-urls N] [--concurrency C] "
                        "[--max-seconds S]\n");
        return 2;
    }
    if (getenv("ROOM_CLIENT_C_DUMP")) dump_left = atoi(getenv("ROOM_CLIENT_C_DUMP"));
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    url_win = calloc((size_t)n_urls, sizeof(long long));
    load(file);
    if (!n_conns) failed("no sockets in the file");
    reset("~none~", 0.0, 0.0);
    rng ^= (uint64_t)getpid() << 32 ^ (uint64_t)(now_s() * 1e6);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    double t0 = mono_s(), stop_at = t0 + max_seconds, next_scan = 0;
    int next = 0, announced = 0;
    struct epoll_event evs[512];
    for (;;) {
        double mnow = mono_s();
        if (mnow >= stop_at) quit_all();
        if (!announced) {
            double now = now_s();
            while (next < n_conns && in_flight < concurrency) { in_flight++; start(&conns[next++], now); }
            if (mnow >= next_scan) { /* attempt timeouts and retries: the ones in flight */
                next_scan = mnow + 0.05;
                for (int i = 0; i < next; i++) {
                    conn_t *c = &conns[i];
                    if (c->state == S_WAIT && now >= c->deadline) start(c, now);
                    else if (c->state >= S_CONNECTING && c->state <= S_JOINING && now >= c->deadline)
                        attempt_failed(c, "TimeoutError()", now);
                }
            }
            if (n_ready == n_conns) {
                long long sampled = 0;
                for (int i = 0; i < n_conns; i++) sampled += conns[i].sampled != 0;
                sbuf s = {0};
                sb_printf(&s, "{\"ev\":\"ready\",\"joined\":%d,\"seconds\":%.2f,\"sampled\":%lld,"
                          "\"pid\":%d}", n_conns, mono_s() - t0, sampled, (int)getpid());
                emit(&s);
                announced = 1;
                fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
                struct epoll_event ev = {.events = EPOLLIN, .data.u32 = STDIN_ID};
                if (epoll_ctl(epfd, EPOLL_CTL_ADD, 0, &ev) < 0) {
                    fprintf(stderr, "room_client: stdin: %s\n", strerror(errno));
                    return 2;
                }
            }
        }
        int timeout = announced ? (poll_us > 0 ? 0 : 1000) : 20;
        int n = epoll_wait(epfd, evs, 512, timeout);
        if (n == 0 && announced && poll_us > 0) {
            /* Not waiting in epoll_wait: a server's write finds no sleeper to wake
               (on this VM a cross-CPU wake-up is dear, and it is paid by the
               writing server); costs up to poll_us of delay per read. */
            struct timespec ts = {poll_us / 1000000, (poll_us % 1000000) * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (n < 0 && errno != EINTR) { perror("epoll_wait"); return 2; }
        for (int i = 0; i < n; i++) {
            uint32_t id = evs[i].data.u32;
            if (id == STDIN_ID) { on_stdin(); continue; }
            conn_t *c = &conns[id];
            if (c->fd < 0) continue;
            if (c->state == S_CONNECTING) on_writable(c, now_s());
            else on_readable(c);
        }
    }
}
