/* test_multipart.c — the multipart/form-data parser of the audio endpoints
 * (src/server/multipart.c): Content-Type boundaries, the body layouts that
 * real clients send (undici / curl / Python), quoted parameters, and the
 * refusals (limits, truncation, malformed headers). Expected values follow
 * RFC 2046 / RFC 7578; the bodies are written out by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/multipart.h"
#include "test_util.h"

static int parse(const char *ct, const char *body, size_t len, kn_mp_part *parts, int max, int *n, kn_error *err) {
    char b[KN_MP_MAX_BOUNDARY + 1];
    kn_code rc = kn_multipart_boundary(ct, b, sizeof b, err);
    if (rc) return rc;
    return kn_multipart_parse(b, body, len, parts, max, n, err);
}

static void test_boundary(void) {
    char b[KN_MP_MAX_BOUNDARY + 1];
    kn_error err = {0};
    CHECK(kn_multipart_boundary("multipart/form-data; boundary=abc", b, sizeof b, &err) == KN_OK && !strcmp(b, "abc"),
          "plain boundary: %s", err.msg);
    CHECK(kn_multipart_boundary("Multipart/Form-Data;boundary=\"a b:c\"", b, sizeof b, &err) == KN_OK &&
              !strcmp(b, "a b:c"),
          "quoted boundary with space: %s", err.msg);
    CHECK(kn_multipart_boundary("multipart/form-data; charset=utf-8; boundary=----x", b, sizeof b, &err) == KN_OK &&
              !strcmp(b, "----x"),
          "boundary after another parameter");
    CHECK(kn_multipart_boundary("application/json", b, sizeof b, &err) == KN_ERR_FORMAT, "json accepted");
    CHECK(kn_multipart_boundary(NULL, b, sizeof b, &err) == KN_ERR_FORMAT, "no header accepted");
    CHECK(kn_multipart_boundary("multipart/form-data", b, sizeof b, &err) == KN_ERR_FORMAT, "no boundary accepted");
    CHECK(kn_multipart_boundary("multipart/form-data; boundary=", b, sizeof b, &err) == KN_ERR_FORMAT, "empty");
    char longb[200];
    snprintf(longb, sizeof longb, "multipart/form-data; boundary=%071d", 0);
    CHECK(kn_multipart_boundary(longb, b, sizeof b, &err) == KN_ERR_FORMAT, "71-character boundary accepted");
    CHECK(kn_multipart_boundary("multipart/form-data; boundary=a; boundary=b", b, sizeof b, &err) == KN_ERR_FORMAT,
          "two boundaries accepted");
    CHECK(kn_multipart_boundary("multipart/form-data; boundary=\"abc", b, sizeof b, &err) == KN_ERR_FORMAT,
          "unterminated quote accepted");
    CHECK(kn_multipart_boundary("multipart/form-data; boundary=a<b", b, sizeof b, &err) == KN_ERR_FORMAT,
          "'<' accepted in a boundary");
}

static void test_bodies(void) {
    kn_mp_part p[8];
    int n = 0;
    kn_error err = {0};
    /* undici-style: quoted names, a file part with binary data holding CR LF and "--" */
    static const char b1[] = "------formdata-undici-1\r\n"
                             "Content-Disposition: form-data; name=\"model\"\r\n\r\n"
                             "whisper-1\r\n"
                             "------formdata-undici-1\r\n"
                             "Content-Disposition: form-data; name=\"file\"; filename=\"a \\\"q\\\".wav\"\r\n"
                             "Content-Type: audio/wav\r\n\r\n"
                             "RIFF\r\n--\0\x01\r\n\r\n"
                             "------formdata-undici-1\r\n"
                             "content-disposition: form-data; name=\"timestamp_granularities[]\"\r\n\r\n"
                             "word\r\n"
                             "------formdata-undici-1\r\n"
                             "Content-Disposition: form-data; name=\"timestamp_granularities[]\"\r\n\r\n"
                             "segment\r\n"
                             "------formdata-undici-1--\r\n";
    kn_code rc = parse("multipart/form-data; boundary=----formdata-undici-1", b1, sizeof b1 - 1, p, 8, &n, &err);
    CHECK(rc == KN_OK && n == 4, "undici body: rc %d, %d parts: %s", rc, n, err.msg);
    if (rc == KN_OK && n == 4) {
        CHECK(!strcmp(p[0].name, "model") && p[0].len == 9 && !memcmp(p[0].data, "whisper-1", 9), "model part");
        CHECK(!strcmp(p[1].name, "file") && p[1].has_filename && !strcmp(p[1].filename, "a \"q\".wav") &&
                  !strcmp(p[1].content_type, "audio/wav") && p[1].len == 12 && !memcmp(p[1].data, "RIFF\r\n--\0\x01\r\n", 12),
              "file part: '%s' %zu bytes", p[1].filename, p[1].len);
        CHECK(!strcmp(p[3].name, "timestamp_granularities[]") && p[3].len == 7, "repeated field");
        CHECK(kn_multipart_get(p, n, "timestamp_granularities[]") == &p[2], "first of a repeated field");
        CHECK(kn_multipart_get(p, n, "prompt") == NULL, "absent field found");
    }
    /* preamble, unquoted name, transport padding after a boundary, empty value, epilogue */
    static const char b2[] = "ignored preamble\r\n--XyZ  \r\nContent-Disposition: form-data; name=a\r\n\r\n\r\n"
                             "--XyZ\r\nContent-Disposition: form-data; name=\"b\"\r\n\r\nv\r\n--XyZ--epilogue";
    rc = parse("multipart/form-data; boundary=XyZ", b2, sizeof b2 - 1, p, 8, &n, &err);
    CHECK(rc == KN_OK && n == 2 && p[0].len == 0 && !p[0].has_filename && p[1].len == 1, "preamble body: %s", err.msg);
    /* an empty form */
    rc = parse("multipart/form-data; boundary=q", "--q--", 5, p, 8, &n, &err);
    CHECK(rc == KN_OK && n == 0, "empty form: %s", err.msg);
    /* refusals */
    static const char *const bad[] = {
        "--q\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nno closing boundary",
        "--q\r\nContent-Disposition: form-data; name=\"a\"\r\nunterminated headers",
        "--q\r\nContent-Type: text/plain\r\n\r\nx\r\n--q--",                      /* no Content-Disposition */
        "--q\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nx\r\n--q--",    /* not form-data */
        "--q\r\nContent-Disposition: form-data; filename=\"a\"\r\n\r\nx\r\n--q--", /* no name */
        "--q\r\nContent-Disposition: form-data; name=\"a\r\n\r\nx\r\n--q--",       /* unterminated quote */
        "--q\r\nno colon here\r\n\r\nx\r\n--q--",
        "--q\nContent-Disposition: form-data; name=\"a\"\n\nx\n--q--",              /* LF only */
        "--q\r\nContent-Disposition: form-data; name=\"a\"; name=\"b\"\r\n\r\nx\r\n--q--",
        "no boundary anywhere",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = 0;
        rc = parse("multipart/form-data; boundary=q", bad[i], strlen(bad[i]), p, 8, &n, &err);
        CHECK(rc == KN_ERR_FORMAT && err.msg[0], "bad body %zu accepted (rc %d)", i, rc);
    }
    /* part-count limit */
    char many[4096];
    size_t k = 0;
    for (int i = 0; i < 9; i++) k += (size_t)snprintf(many + k, sizeof many - k, "--q\r\nContent-Disposition: form-data; name=\"f%d\"\r\n\r\nv\r\n", i);
    k += (size_t)snprintf(many + k, sizeof many - k, "--q--");
    rc = parse("multipart/form-data; boundary=q", many, k, p, 8, &n, &err);
    CHECK(rc == KN_ERR_FORMAT && strstr(err.msg, "more than 8 parts"), "9 parts into 8: %s", err.msg);
    /* header block limit */
    size_t big = KN_MP_MAX_HEADER_BYTES + 100;
    char *hb = malloc(big + 64);
    k = (size_t)snprintf(hb, big + 64, "--q\r\nX-Pad: ");
    memset(hb + k, 'a', big - k);
    memcpy(hb + big, "\r\n\r\nx\r\n--q--", 12);
    rc = parse("multipart/form-data; boundary=q", hb, big + 12, p, 8, &n, &err);
    CHECK(rc == KN_ERR_FORMAT && strstr(err.msg, "headers longer"), "oversized headers: %s", err.msg);
    free(hb);
    /* a name too long for the part record */
    char ln[400];
    snprintf(ln, sizeof ln, "--q\r\nContent-Disposition: form-data; name=\"%0200d\"\r\n\r\nx\r\n--q--", 0);
    rc = parse("multipart/form-data; boundary=q", ln, strlen(ln), p, 8, &n, &err);
    CHECK(rc == KN_ERR_FORMAT, "200-character name accepted");
}

int main(void) {
    test_boundary();
    test_bodies();
    return kn_test_done("test_multipart");
}
