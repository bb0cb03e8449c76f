/* test_metrics.c - unit tests of the exports: Prometheus text rendering, the
 * HTTP request parser and endpoint, InfluxDB line protocol, URLs and POST,
 * and reading a running energy meter. SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "emlio/energy.h"
#include "influx.h"
#include "metrics.h"

/* The buffer's text, NUL-terminated (emlio_buf_addf keeps a spare byte, but
 * emlio_buf_add does not promise one). */
static const char *
s_text(emlio_buf_t *b)
{
    assert_int_equal(emlio_buf_add(b, "", 1), 0);
    b->len--;
    return (const char *)b->data;
}

/* --- Prometheus text. --- */

static void
test_metrics_family_and_sample(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    assert_int_equal(tool_metrics_family(&b, "emlio_samples_total", "counter",
                                         "Samples\\sent\nnow"),
                     0);
    assert_int_equal(
        tool_metrics_sample_u64(&b, "emlio_samples_total", NULL, 0, UINT64_MAX),
        0);
    assert_string_equal(s_text(&b),
                        "# HELP emlio_samples_total Samples\\\\sent\\nnow\n"
                        "# TYPE emlio_samples_total counter\n"
                        "emlio_samples_total 18446744073709551615\n");
    emlio_buf_clear(&b);
    const tool_metrics_label_t l[] = { { "source", "model" },
                                       { "name", "a\"b\\c\nd" } };
    assert_int_equal(
        tool_metrics_sample(&b, "emlio_energy_joules_total", l, 2, 1.5), 0);
    assert_int_equal(tool_metrics_sample(&b, "x", NULL, 0, NAN), 0);
    assert_int_equal(tool_metrics_sample(&b, "x", NULL, 0, INFINITY), 0);
    assert_int_equal(tool_metrics_sample(&b, "x", NULL, 0, -INFINITY), 0);
    assert_int_equal(tool_metrics_sample(&b, "x", NULL, 0, 0.1), 0);
    assert_string_equal(
        s_text(&b),
        "emlio_energy_joules_total{source=\"model\",name=\"a\\\"b\\\\c\\nd\"} "
        "1.5\nx NaN\nx +Inf\nx -Inf\nx 0.1\n");
    emlio_buf_release(&b);
}

static void
test_metrics_bad_names(void **state)
{
    (void)state;
    assert_true(tool_metrics_name_ok("emlio:x_1", false));
    assert_false(tool_metrics_name_ok("emlio:x", true));
    assert_false(tool_metrics_name_ok("1abc", false));
    assert_false(tool_metrics_name_ok("a-b", false));
    assert_false(tool_metrics_name_ok("", false));
    assert_false(tool_metrics_name_ok("__reserved", true));
    emlio_buf_t b = EMLIO_BUF_INIT;
    assert_int_equal(tool_metrics_family(&b, "ok", "histogram", "h"),
                     EMLIO_EINVAL);
    assert_int_equal(tool_metrics_family(&b, "not ok", "gauge", "h"),
                     EMLIO_EINVAL);
    const tool_metrics_label_t bad[] = { { "a-b", "v" } };
    assert_int_equal(tool_metrics_sample(&b, "ok", bad, 1, 1), EMLIO_EINVAL);
    assert_int_equal(b.len, 0);
    emlio_buf_release(&b);
}

/* --- HTTP requests. --- */

static int
s_parse(const char *text, tool_metrics_request_t *req)
{
    return tool_metrics_parse_request(req, text, strlen(text));
}

static void
test_metrics_parse_request_good(void **state)
{
    (void)state;
    tool_metrics_request_t req;
    const char *r = "GET /metrics HTTP/1.1\r\nHost: x:1\r\nAccept: */*\r\n\r\n";
    assert_int_equal(s_parse(r, &req), (int)strlen(r));
    assert_int_equal(req.method_len, 3);
    assert_memory_equal(req.target, "/metrics", 8);
    assert_int_equal(req.minor_version, 1);
    assert_int_equal(tool_metrics_route(&req), 200);
    /* Bare LF, HTTP/1.0, a query, and bytes after the head. */
    r = "GET /metrics?x=1 HTTP/1.0\n\nBODY";
    assert_int_equal(s_parse(r, &req), (int)strlen(r) - 4);
    assert_int_equal(tool_metrics_route(&req), 200);
    assert_int_equal(s_parse("GET /metricsx HTTP/1.1\r\n\r\n", &req), 26);
    assert_int_equal(tool_metrics_route(&req), 404);
    assert_int_equal(s_parse("GET / HTTP/1.1\r\n\r\n", &req), 18);
    assert_int_equal(tool_metrics_route(&req), 404);
    assert_true(s_parse("POST /metrics HTTP/1.1\r\n\r\n", &req) > 0);
    assert_int_equal(tool_metrics_route(&req), 405);
    assert_true(s_parse("get /metrics HTTP/1.1\r\n\r\n", &req) > 0);
    assert_int_equal(tool_metrics_route(&req), 405);
}

static void
test_metrics_parse_request_incomplete(void **state)
{
    (void)state;
    const char *r = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    tool_metrics_request_t req;
    for (size_t n = 0; n < strlen(r); n++) {
        /* A copy of exactly n bytes, so reading past n would trip ASan. */
        char *part = malloc(n ? n : 1);
        memcpy(part, r, n);
        assert_int_equal(tool_metrics_parse_request(&req, part, n),
                         EMLIO_EINCOMPLETE);
        free(part);
    }
}

static void
test_metrics_parse_request_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "\x16\x03\x01\x02\x00",                /* a TLS hello */
        "GET /metrics\r\n\r\n",                /* no version */
        "GET  /metrics HTTP/1.1\r\n\r\n",      /* empty target */
        "GET /metrics HTTP/2.0\r\n\r\n",       /* not HTTP/1.x */
        "GET /metrics HTTP/1.1 \r\n\r\n",      /* trailing junk */
        "GET /m\x01 HTTP/1.1\r\n\r\n",         /* control byte in the target */
        "GET /metrics HTTP/1.1\r\n x\r\n\r\n", /* folded header */
        "GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",  /* no ':' */
        "GET /metrics HTTP/1.1\r\n: x\r\n\r\n",     /* empty name */
        "GET /metrics HTTP/1.1\r\nA: b\rc\r\n\r\n", /* bare CR */
        "GET /metrics HTTP/1.1\r\nA: \x7f\r\n\r\n", /* DEL in a value */
        " GET /metrics HTTP/1.1\r\n\r\n",
        "\r\n",
    };
    tool_metrics_request_t req;
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(bad); i++) {
        int rc = s_parse(bad[i], &req);
        if (rc != EMLIO_EPROTO)
            fail_msg("case %zu parsed as %d", i, rc);
    }
    /* A head longer than the limit is refused, not buffered further. */
    size_t n = TOOL_METRICS_MAX_REQUEST + 100;
    char *big = malloc(n);
    memcpy(big, "GET /", 5);
    memset(big + 5, 'a', n - 5);
    assert_int_equal(tool_metrics_parse_request(&req, big, n), EMLIO_EPROTO);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    assert_int_equal(
        tool_metrics_parse_request(&req, big, TOOL_METRICS_MAX_REQUEST),
        EMLIO_EPROTO);
    assert_int_equal(
        tool_metrics_parse_request(&req, big, TOOL_METRICS_MAX_REQUEST - 1),
        EMLIO_EINCOMPLETE);
    free(big);
}

/* --- The HTTP endpoint, live. --- */

static int
s_render(void *userdata, emlio_buf_t *out)
{
    int *calls = userdata;
    (*calls)++;
    return emlio_buf_addf(out, "x_total %d\n", *calls);
}

/* Starts a non-blocking connect to the endpoint (it may not complete). */
static int
s_dial_nb(const char *address)
{
    const char *colon = strrchr(address, ':');
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(rc == 0 || errno == EINPROGRESS);
    return fd;
}

/* Connects to the endpoint's port on 127.0.0.1. */
static int
s_dial(const char *address)
{
    int fd = s_dial_nb(address);
    struct pollfd pfd = { .fd = fd, .events = POLLOUT };
    int err = 0;
    socklen_t len = sizeof(err);
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
    assert_int_equal(err, 0);
    assert_int_equal(fcntl(fd, F_SETFL, 0), 0); /* blocking again */
    return fd;
}

/* Sends len bytes of req and reads the whole answer (until close, within
 * 5 s) into out. */
static void
s_exchange(const char *address, const char *req, size_t len, char *out,
           size_t cap)
{
    int fd = s_dial(address);
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the endpoint may answer and close early */
        off += (size_t)n;
    }
    size_t got = 0;
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    while (got < cap - 1 && poll(&pfd, 1, 5000) > 0) {
        ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
}

static void
test_metrics_http_endpoint(void **state)
{
    (void)state;
    int calls = 0;
    tool_metrics_http_t *h = tool_metrics_http_new(s_render, &calls);
    assert_non_null(h);
    assert_int_equal(tool_metrics_http_bind(h, "nonsense"), EMLIO_EINVAL);
    assert_int_equal(tool_metrics_http_bind(h, "127.0.0.1:99999"),
                     EMLIO_EINVAL);
    assert_int_equal(tool_metrics_http_start(h), EMLIO_ESTATE);
    assert_int_equal(tool_metrics_http_bind(h, "127.0.0.1:0"), 0);
    const char *addr = tool_metrics_http_address(h);
    assert_true(strncmp(addr, "127.0.0.1:", 10) == 0 && atoi(addr + 10) > 0);
    assert_int_equal(tool_metrics_http_start(h), 0);

    char out[4096];
    const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    s_exchange(addr, get, strlen(get), out, sizeof(out));
    assert_non_null(strstr(out, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(out, "Content-Type: " TOOL_METRICS_CONTENT_TYPE));
    assert_non_null(strstr(out, "Content-Length: 10\r\n"));
    assert_non_null(strstr(out, "\r\n\r\nx_total 1\n"));

    const char *other = "GET /x HTTP/1.1\r\n\r\n";
    s_exchange(addr, other, strlen(other), out, sizeof(out));
    assert_non_null(strstr(out, "HTTP/1.1 404 "));
    const char *post = "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    s_exchange(addr, post, strlen(post), out, sizeof(out));
    assert_non_null(strstr(out, "HTTP/1.1 405 "));
    assert_non_null(strstr(out, "Allow: GET\r\n"));
    s_exchange(addr, "\x16\x03\x01garbage", 10, out, sizeof(out));
    assert_non_null(strstr(out, "HTTP/1.1 400 "));
    size_t n = TOOL_METRICS_MAX_REQUEST * 2;
    char *big = malloc(n);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    memset(big + 26, 'a', n - 26);
    s_exchange(addr, big, n, out, sizeof(out));
    free(big);
    assert_non_null(strstr(out, "HTTP/1.1 431 "));

    /* A peer that goes away mid-request does not disturb the next one. */
    int fd = s_dial(addr);
    assert_int_equal(send(fd, "GET /met", 8, 0), 8);
    close(fd);
    s_exchange(addr, get, strlen(get), out, sizeof(out));
    assert_non_null(strstr(out, "x_total 2\n"));
    assert_int_equal(calls, 2);
    assert_true(tool_metrics_http_served(h) >= 6);

    /* Idle connections are closed at stop; destroy is idempotent. */
    int idle = s_dial(addr);
    tool_metrics_http_stop(h);
    tool_metrics_http_stop(h);
    close(idle);
    tool_metrics_http_destroy(&h);
    assert_null(h);
    tool_metrics_http_destroy(&h);
}

/* 200 peers that connect and say nothing (or half a request) must not
 * keep a scrape waiting: it is answered at once, not after their 5 s
 * lives in turn (which took 12 s, past Prometheus' 10 s timeout). */
static void
test_metrics_slow_peers_do_not_delay_a_scrape(void **state)
{
    (void)state;
    int calls = 0;
    tool_metrics_http_t *h = tool_metrics_http_new(s_render, &calls);
    assert_non_null(h);
    assert_int_equal(tool_metrics_http_bind(h, "127.0.0.1:0"), 0);
    assert_int_equal(tool_metrics_http_start(h), 0);
    const char *addr = tool_metrics_http_address(h);
    int slow[200];
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(slow); i++) {
        slow[i] = s_dial_nb(addr);
        if (i % 2) /* half a request head, never finished */
            (void)send(slow[i], "GET /met", 8, MSG_NOSIGNAL);
    }
    /* The scrape: a bounded wait for each step (3 s, far beyond what an
     * answer takes, far below the 25 x 5 s the peers could hold it). */
    int fd = s_dial_nb(addr);
    struct pollfd pfd = { .fd = fd, .events = POLLOUT };
    assert_int_equal(poll(&pfd, 1, 3000), 1);
    const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, get, strlen(get), MSG_NOSIGNAL),
                     (ssize_t)strlen(get));
    char out[1024];
    size_t got = 0;
    pfd.events = POLLIN;
    while (got < sizeof(out) - 1 && poll(&pfd, 1, 3000) > 0) {
        ssize_t n = recv(fd, out + got, sizeof(out) - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    assert_non_null(strstr(out, "HTTP/1.1 200 OK\r\n"));
    close(fd);
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(slow); i++)
        close(slow[i]);
    tool_metrics_http_destroy(&h);
}

/* --- Line protocol. --- */

static void
test_influx_line_protocol(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    tool_influx_point_t p;
    tool_influx_begin(&p, &b, "emlio epoch,x");
    tool_influx_tag(&p, "host name", "a=b,c d");
    tool_influx_tag(&p, "empty", ""); /* left out */
    tool_influx_int(&p, "samples", 64);
    tool_influx_float(&p, "seconds", 1.25);
    tool_influx_float(&p, "nan", NAN); /* left out */
    tool_influx_float(&p, "inf", INFINITY);
    tool_influx_str(&p, "src", "say \"hi\" \\ now\nnext");
    tool_influx_float(&p, "k=1,x y", 2);
    assert_int_equal(tool_influx_end(&p, 1700000000000000000), 0);
    assert_string_equal(
        s_text(&b),
        "emlio\\ epoch\\,x,host\\ name=a\\=b\\,c\\ d samples=64i,seconds=1.25,"
        "src=\"say \\\"hi\\\" \\\\ now next\",k\\=1\\,x\\ y=2 "
        "1700000000000000000\n");

    /* A point without fields is refused and leaves the buffer as it was. */
    size_t before = b.len;
    tool_influx_begin(&p, &b, "m");
    tool_influx_tag(&p, "t", "v");
    tool_influx_float(&p, "f", NAN);
    assert_int_equal(tool_influx_end(&p, 0), EMLIO_EINVAL);
    assert_int_equal(b.len, before);

    /* No timestamp: the server's clock. */
    emlio_buf_clear(&b);
    tool_influx_begin(&p, &b, "m");
    tool_influx_int(&p, "n", -3);
    assert_int_equal(tool_influx_end(&p, 0), 0);
    assert_string_equal(s_text(&b), "m n=-3i\n");
    emlio_buf_release(&b);
}

/* --- URLs. --- */

static void
test_influx_url_good(void **state)
{
    (void)state;
    char err[EMLIO_ERRMSG_LEN];
    tool_influx_url_t u;
    assert_int_equal(
        tool_influx_url_parse(&u, "http://127.0.0.1:8086/write?db=emlio", err),
        0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8086);
    assert_string_equal(u.path, "/write?db=emlio");
    assert_int_equal(tool_influx_url_parse(&u, "HTTP://influx.example", err),
                     0);
    assert_string_equal(u.host, "influx.example");
    assert_int_equal(u.port, 80);
    assert_string_equal(u.path, "/");
    assert_int_equal(tool_influx_url_parse(&u, "http://[::1]:9/w", err), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9);
    assert_string_equal(u.path, "/w");
    assert_int_equal(tool_influx_url_parse(&u, "http://h?db=x", err), 0);
    assert_string_equal(u.path, "/?db=x");
    assert_int_equal(tool_influx_url_parse(&u, "http://h:65535", err), 0);
    assert_int_equal(u.port, 65535);
}

static void
test_influx_url_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "http://",
        "https://127.0.0.1:8086/write",
        "ftp://h/",
        "127.0.0.1:8086/write",
        "http://:80/",
        "http://h:0/",
        "http://h:65536/",
        "http://h:99999999999999999999/",
        "http://h:/",
        "http://h:80x/",
        "http://user:pw@h/",
        "http://h/#frag",
        "http://h /",
        "http://h/a b",
        "http://h/\x01",
        "http://[::1/",
        "http://[::1]x/",
        "http://[zz]/",
        "http://h\xc3\xa9/",
        "http://h_%/",
    };
    char err[EMLIO_ERRMSG_LEN];
    tool_influx_url_t u;
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(bad); i++) {
        err[0] = '\0';
        int rc = tool_influx_url_parse(&u, bad[i], err);
        if (rc != EMLIO_EINVAL || !err[0])
            fail_msg("'%s' parsed (rc %d)", bad[i], rc);
    }
    assert_int_equal(tool_influx_url_parse(&u, "https://h/", err),
                     EMLIO_EINVAL);
    assert_non_null(strstr(err, "https is not supported"));
    /* Limits: a host of 256 bytes, a path beyond the buffer. */
    char big[TOOL_INFLUX_PATH_MAX + 64];
    snprintf(big, sizeof(big), "http://");
    memset(big + 7, 'h', 256);
    big[7 + 256] = '\0';
    assert_int_equal(tool_influx_url_parse(&u, big, err), EMLIO_EINVAL);
    snprintf(big, sizeof(big), "http://h/");
    memset(big + 9, 'p', TOOL_INFLUX_PATH_MAX);
    big[9 + TOOL_INFLUX_PATH_MAX] = '\0';
    assert_int_equal(tool_influx_url_parse(&u, big, err), EMLIO_EINVAL);
}

/* --- POST. --- */

static void
test_influx_post_answers(void **state)
{
    (void)state;
    char err[EMLIO_ERRMSG_LEN];
    tool_influx_url_t u;
    /* The metrics endpoint answers POST with 405: a non-2xx answer. */
    int calls = 0;
    tool_metrics_http_t *h = tool_metrics_http_new(s_render, &calls);
    assert_int_equal(tool_metrics_http_bind(h, "127.0.0.1:0"), 0);
    assert_int_equal(tool_metrics_http_start(h), 0);
    char url[128];
    snprintf(url, sizeof(url), "http://%s/metrics",
             tool_metrics_http_address(h));
    assert_int_equal(tool_influx_url_parse(&u, url, err), 0);
    assert_int_equal(tool_influx_post(&u, "m f=1\n", 6, 2000, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "answered 405"));
    tool_metrics_http_destroy(&h);

    /* A listener that never accepts: the deadline holds. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t sl = sizeof(sa);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/write",
             (unsigned)ntohs(sa.sin_port));
    assert_int_equal(tool_influx_url_parse(&u, url, err), 0);
    double t0 = emlio__now_s();
    assert_int_equal(tool_influx_post(&u, "m f=1\n", 6, 300, err),
                     EMLIO_ETIMEDOUT);
    double dt = emlio__now_s() - t0;
    assert_true(dt >= 0.25 && dt < 2.0);

    /* Nobody listening: refused at once. */
    close(lfd);
    assert_int_equal(tool_influx_post(&u, "m f=1\n", 6, 2000, err),
                     -ECONNREFUSED);
    assert_non_null(strstr(err, "cannot connect"));
}

/* --- A running meter's totals. --- */

static void
test_energy_read_running(void **state)
{
    (void)state;
    emlio_energy_t *m = emlio_energy_new();
    assert_non_null(m);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_read(m, &r), EMLIO_ESTATE);
    assert_int_equal(emlio_energy_set_backend(m, EMLIO_ENERGY_MODEL), 0);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_OFF), 0);
    assert_int_equal(emlio_energy_set_interval_ms(m, 5), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    usleep(20000);
    assert_int_equal(emlio_energy_read(m, &r), 0);
    assert_true(emlio_energy_running(m));
    assert_string_equal(r.source, "model");
    assert_true(r.modelled && r.energy_j > 0 && r.wall_s >= 0.015);
    double first = r.energy_j;
    usleep(20000);
    assert_int_equal(emlio_energy_read(m, &r), 0);
    assert_true(r.energy_j > first && r.wall_s >= 0.035);
    emlio_energy_report_t last;
    assert_int_equal(emlio_energy_stop(m, &last), 0);
    assert_true(last.energy_j >= r.energy_j);
    emlio_energy_destroy(&m);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_family_and_sample),
        cmocka_unit_test(test_metrics_bad_names),
        cmocka_unit_test(test_metrics_parse_request_good),
        cmocka_unit_test(test_metrics_parse_request_incomplete),
        cmocka_unit_test(test_metrics_parse_request_bad),
        cmocka_unit_test(test_metrics_http_endpoint),
        cmocka_unit_test(test_metrics_slow_peers_do_not_delay_a_scrape),
        cmocka_unit_test(test_influx_line_protocol),
        cmocka_unit_test(test_influx_url_good),
        cmocka_unit_test(test_influx_url_bad),
        cmocka_unit_test(test_influx_post_answers),
        cmocka_unit_test(test_energy_read_running),
    };
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
