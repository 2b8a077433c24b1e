/* word_timing.c — word-level timestamps (see word_timing.h): alignment-head
 * cross-attention, median filter, DTW, word grouping and openai-whisper's
 * punctuation and duration rules. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "engine/word_timing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MEDFILT_WIDTH 7
#define TOKENS_PER_SECOND 50.0 /* encoder positions per second */

/* ---- Python-compatible string helpers (the detokenizer's UTF-8 is valid) ---- */

static int utf8_next(const char *s, size_t len, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t left = len - *i;
    int n = p[0] < 0x80 ? 1 : p[0] < 0xE0 ? 2 : p[0] < 0xF0 ? 3 : 4;
    if ((size_t)n > left) n = 1;
    int cp = n == 1 ? p[0] : n == 2 ? p[0] & 0x1F : n == 3 ? p[0] & 0x0F : p[0] & 0x07;
    for (int k = 1; k < n; k++) cp = (cp << 6) | (p[k] & 0x3F);
    *i += (size_t)n;
    return cp;
}

static long cp_count(const char *s) {
    size_t i = 0, n = strlen(s);
    long c = 0;
    while (i < n) utf8_next(s, n, &i), c++;
    return c;
}

/* index (in code points) of the first U+FFFD, or -1 */
static long cp_index_fffd(const char *s) {
    size_t i = 0, n = strlen(s);
    for (long c = 0; i < n; c++)
        if (utf8_next(s, n, &i) == 0xFFFD) return c;
    return -1;
}

/* code point at index k, or -1 past the end */
static int cp_at(const char *s, long k) {
    size_t i = 0, n = strlen(s);
    for (long c = 0; i < n; c++) {
        int cp = utf8_next(s, n, &i);
        if (c == k) return cp;
    }
    return -1;
}

/* str.isspace() of one code point */
static int py_isspace(int c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* str.strip(): the byte range [*b, *e) of s */
static void py_strip(const char *s, size_t *b, size_t *e) {
    size_t n = strlen(s), i = 0, start = n, end = 0;
    while (i < n) {
        size_t at = i;
        if (!py_isspace(utf8_next(s, n, &i))) {
            if (start == n) start = at;
            end = i;
        }
    }
    if (start == n) start = end = 0;
    *b = start, *e = end;
}

/* Python's `needle in haystack` for strings ("" is in everything) */
static int py_in(const char *needle, size_t len, const char *haystack) {
    return len == 0 || memmem(haystack, strlen(haystack), needle, len) != NULL;
}

static int stripped_in(const char *s, const char *set) {
    size_t b, e;
    py_strip(s, &b, &e);
    return py_in(s + b, e - b, set);
}

static char *concat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *r = malloc(la + lb + 1);
    if (!r) return NULL;
    memcpy(r, a, la);
    memcpy(r + la, b, lb + 1);
    return r;
}

void kn_word_spans_free(kn_word_span *w, int n) {
    for (int i = 0; w && i < n; i++) free(w[i].text);
    free(w);
}

/* ---- grouping tokens into words ---------------------------------------------- */

static kn_code push_span(kn_word_span **v, int *n, int *cap, char *text, int first, int count, kn_error *err) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        kn_word_span *p = realloc(*v, sizeof **v * (size_t)nc);
        if (!p) {
            free(text);
            return kn_fail(err, KN_ERR_NOMEM, "out of memory");
        }
        *v = p, *cap = nc;
    }
    (*v)[(*n)++] = (kn_word_span){.text = text, .first = first, .count = count};
    return KN_OK;
}

/* The detokenizer may skip special tokens; openai-whisper decodes
 * <|endoftext|> as its text (so it never merges into a word as "" would). */
static const char EOT_TEXT[] = "<|endoftext|>";

static kn_code split_on_unicode(kn_detok_fn detok, void *user, int eot, const int32_t *tokens, int n,
                                kn_word_span **out, int *n_out, kn_error *err) {
    *out = NULL, *n_out = 0;
    char *full = NULL;
    kn_code rc = detok(user, tokens, n, &full, err);
    if (rc) return rc;
    kn_word_span *v = NULL;
    int nv = 0, cap = 0, first = 0;
    long offset = 0;
    for (int i = 0; i < n && !rc; i++) {
        char *dec = NULL;
        if (tokens[i] == eot && first == i) { /* a complete word: its own text */
            if (!(dec = malloc(sizeof EOT_TEXT))) {
                rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
                break;
            }
            memcpy(dec, EOT_TEXT, sizeof EOT_TEXT);
            rc = push_span(&v, &nv, &cap, dec, first, 1, err);
            first = i + 1;
            continue;
        }
        if ((rc = detok(user, tokens + first, i - first + 1, &dec, err))) break;
        long k = cp_index_fffd(dec);
        if (k < 0 || cp_at(full, offset + k) == 0xFFFD) {
            offset += cp_count(dec);
            rc = push_span(&v, &nv, &cap, dec, first, i - first + 1, err);
            first = i + 1;
        } else free(dec);
    }
    free(full);
    if (rc) {
        kn_word_spans_free(v, nv);
        return rc;
    }
    *out = v, *n_out = nv;
    return KN_OK;
}

kn_code kn_word_split(kn_detok_fn detok, void *user, int eot, const int32_t *tokens, int n, int by_unicode,
                      kn_word_span **out, int *n_out, kn_error *err) {
    kn_word_span *sub;
    int ns;
    kn_code rc = split_on_unicode(detok, user, eot, tokens, n, &sub, &ns, err);
    if (rc || by_unicode) {
        *out = sub, *n_out = ns;
        return rc;
    }
    static const char punctuation[] = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"; /* string.punctuation */
    int nw = 0;
    for (int i = 0; i < ns; i++) {
        int special = tokens[sub[i].first] >= eot;
        int with_space = sub[i].text[0] == ' ';
        if (special || with_space || stripped_in(sub[i].text, punctuation) || nw == 0) {
            sub[nw++] = sub[i];
        } else {
            char *t = concat(sub[nw - 1].text, sub[i].text);
            if (!t) {
                for (int k = i; k < ns; k++) free(sub[k].text);
                kn_word_spans_free(sub, nw);
                return kn_fail(err, KN_ERR_NOMEM, "out of memory");
            }
            free(sub[nw - 1].text);
            free(sub[i].text);
            sub[nw - 1].text = t;
            sub[nw - 1].count += sub[i].count;
        }
    }
    *out = sub, *n_out = nw;
    return KN_OK;
}

/* a's tokens followed by b's (the spans are adjacent or one is empty) into dst */
static kn_code join_into(kn_word_span *dst, const kn_word_span *a, const kn_word_span *b, kn_error *err) {
    char *t = concat(a->text, b->text);
    if (!t) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    int first = a->count ? a->first : b->first;
    int count = a->count + b->count;
    free(dst->text);
    dst->text = t;
    dst->first = first, dst->count = count;
    return KN_OK;
}

static kn_code empty_span(kn_word_span *w, kn_error *err) {
    char *t = malloc(1);
    if (!t) return kn_fail(err, KN_ERR_NOMEM, "out of memory");
    t[0] = 0;
    free(w->text);
    w->text = t;
    w->count = 0;
    return KN_OK;
}

kn_code kn_word_merge_punctuations(kn_word_span *w, int n, const char *prepend, const char *append, kn_error *err) {
    kn_code rc;
    /* prepended punctuation joins the following word */
    for (int i = n - 2, j = n - 1; i >= 0; i--) {
        if (w[i].text[0] == ' ' && stripped_in(w[i].text, prepend)) {
            kn_word_span prev = w[i];
            if ((rc = join_into(&w[j], &prev, &w[j], err)) || (rc = empty_span(&w[i], err))) return rc;
        } else j = i;
    }
    /* appended punctuation joins the previous word */
    for (int i = 0, j = 1; j < n; j++) {
        size_t pl = strlen(w[i].text);
        if (!(pl > 0 && w[i].text[pl - 1] == ' ') && py_in(w[j].text, strlen(w[j].text), append)) {
            kn_word_span foll = w[j];
            if ((rc = join_into(&w[i], &w[i], &foll, err)) || (rc = empty_span(&w[j], err))) return rc;
        } else i = j;
    }
    return KN_OK;
}

/* ---- alignment ------------------------------------------------------------------ */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* median filter of odd width along rows of length m (reflect padding), as
 * openai-whisper's median_filter; rows shorter than width/2+1 stay as they are */
static void median_rows(float *x, int rows, int m, int width, float *tmp) {
    int pad = width / 2;
    if (m <= pad) return;
    float win[64];
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * m;
        for (int f = 0; f < m; f++) {
            for (int k = 0; k < width; k++) {
                int idx = f + k - pad;
                if (idx < 0) idx = -idx;
                if (idx >= m) idx = 2 * (m - 1) - idx;
                win[k] = row[idx];
            }
            qsort(win, (size_t)width, sizeof *win, cmp_float);
            tmp[f] = win[pad];
        }
        memcpy(row, tmp, sizeof(float) * (size_t)m);
    }
}

/* DTW over cost x [n, m] (row-major, doubles) as openai-whisper's dtw_cpu
 * (float32 accumulated cost, ties go to the time step); fills the path's
 * text and time indices (at most n + m entries each), returns its length. */
static long dtw(const double *x, int n, int m, int *ti, int *tj, float *cost, signed char *trace) {
    const size_t W = (size_t)m + 1;
    for (size_t k = 0; k < (size_t)(n + 1) * W; k++) cost[k] = INFINITY, trace[k] = -1;
    cost[0] = 0.0f;
    for (int j = 1; j <= m; j++)
        for (int i = 1; i <= n; i++) {
            float c0 = cost[(size_t)(i - 1) * W + j - 1], c1 = cost[(size_t)(i - 1) * W + j], c2 = cost[(size_t)i * W + j - 1];
            float c;
            signed char t;
            if (c0 < c1 && c0 < c2) c = c0, t = 0;
            else if (c1 < c0 && c1 < c2) c = c1, t = 1;
            else c = c2, t = 2;
            cost[(size_t)i * W + j] = (float)(x[(size_t)(i - 1) * m + j - 1] + (double)c);
            trace[(size_t)i * W + j] = t;
        }
    for (int j = 0; j <= m; j++) trace[j] = 2;
    for (int i = 0; i <= n; i++) trace[(size_t)i * W] = 1;
    int i = n, j = m;
    long len = 0;
    while (i > 0 || j > 0) {
        ti[len] = i - 1, tj[len] = j - 1, len++;
        signed char t = trace[(size_t)i * W + j];
        if (t == 0) i--, j--;
        else if (t == 1) i--;
        else j--;
    }
    for (long a = 0, b = len - 1; a < b; a++, b--) {
        int s = ti[a];
        ti[a] = ti[b], ti[b] = s;
        s = tj[a];
        tj[a] = tj[b], tj[b] = s;
    }
    return len;
}

kn_code kn_word_jump_times(kn_whisper *w, const int32_t *sot_seq, int n_sot, const int32_t *text, int n_text,
                           int n_frames, double *jump_times, double *probs, kn_error *err) {
    const kn_whisper_config *c = kn_whisper_cfg(w);
    const int T = n_sot + n_text + 2, F = n_frames / 2, H = c->n_align, V = c->vocab_size, eot = c->eos_token_id;
    if (F < 1 || F > c->max_source_positions || T > c->max_target_positions || H < 1 || eot < 0 ||
        c->no_timestamps_token_id < 0)
        return kn_fail(err, KN_ERR_INVALID_ARG, "word timestamps: %d tokens over %d frames cannot be aligned", T,
                       n_frames);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)T);
    float *qk = malloc(sizeof(float) * (size_t)H * T * F);
    float *logits = malloc(sizeof(float) * (size_t)T * V);
    float *tmp = malloc(sizeof(float) * (size_t)(F > T ? F : T));
    double *mat = malloc(sizeof(double) * (size_t)(n_text + 1) * F);
    int *ti = malloc(sizeof(int) * (size_t)(n_text + 1 + F));
    int *tj = malloc(sizeof(int) * (size_t)(n_text + 1 + F));
    float *cost = malloc(sizeof(float) * (size_t)(n_text + 2) * (F + 1));
    signed char *trace = malloc((size_t)(n_text + 2) * (F + 1));
    kn_code rc = KN_OK;
    if (!tokens || !qk || !logits || !tmp || !mat || !ti || !tj || !cost || !trace) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory for word timestamps");
        goto done;
    }
    memcpy(tokens, sot_seq, sizeof(int32_t) * (size_t)n_sot);
    tokens[n_sot] = c->no_timestamps_token_id;
    memcpy(tokens + n_sot + 1, text, sizeof(int32_t) * (size_t)n_text);
    tokens[T - 1] = eot;
    if ((rc = kn_whisper_cross_qk(w, tokens, T, F, qk, logits, err))) goto done;
    for (int a = 0; a < H; a++) {
        float *x = qk + (size_t)a * T * F;
        /* softmax over the audio's frames */
        for (int i = 0; i < T; i++) {
            float *r = x + (size_t)i * F;
            float mx = r[0];
            for (int f = 1; f < F; f++) mx = r[f] > mx ? r[f] : mx;
            double s = 0;
            for (int f = 0; f < F; f++) s += exp((double)r[f] - mx);
            for (int f = 0; f < F; f++) r[f] = (float)(exp((double)r[f] - mx) / s);
        }
        /* standardise each frame over the tokens (population std) */
        for (int f = 0; f < F; f++) {
            double mean = 0, var = 0;
            for (int i = 0; i < T; i++) mean += x[(size_t)i * F + f];
            mean /= T;
            for (int i = 0; i < T; i++) {
                double d = x[(size_t)i * F + f] - mean;
                var += d * d;
            }
            double sd = sqrt(var / T);
            for (int i = 0; i < T; i++)
                x[(size_t)i * F + f] = sd > 0 ? (float)((x[(size_t)i * F + f] - mean) / sd) : 0.0f;
        }
        median_rows(x, T, F, MEDFILT_WIDTH, tmp);
    }
    /* mean over heads, rows of <|notimestamps|> .. the last text token; DTW on -matrix */
    for (int i = 0; i <= n_text; i++)
        for (int f = 0; f < F; f++) {
            float s = 0.0f;
            for (int a = 0; a < H; a++) s += qk[((size_t)a * T + n_sot + i) * F + f];
            mat[(size_t)i * F + f] = -(double)(s / (float)H);
        }
    long len = dtw(mat, n_text + 1, F, ti, tj, cost, trace);
    int nj = 0;
    for (long k = 0; k < len && nj <= n_text; k++)
        if (k == 0 || ti[k] != ti[k - 1]) jump_times[nj++] = tj[k] / TOKENS_PER_SECOND;
    while (nj <= n_text) jump_times[nj] = nj ? jump_times[nj - 1] : 0.0, nj++; /* never short in practice */
    /* each text token's probability among the text tokens (teacher-forced) */
    for (int k = 0; probs && k < n_text; k++) {
        const float *r = logits + (size_t)(n_sot + k) * V;
        float mx = r[0];
        for (int v = 1; v < eot; v++) mx = r[v] > mx ? r[v] : mx;
        double s = 0;
        for (int v = 0; v < eot; v++) s += exp((double)r[v] - mx);
        probs[k] = text[k] < eot ? exp((double)r[text[k]] - mx) / s : 0.0;
    }
done:
    free(tokens), free(qk), free(logits), free(tmp), free(mat), free(ti), free(tj), free(cost), free(trace);
    return rc;
}

kn_code kn_word_find_alignment(kn_whisper *w, const int32_t *sot_seq, int n_sot, const int32_t *text, int n_text,
                               int n_frames, kn_detok_fn detok, void *user, int by_unicode, kn_word_span **out,
                               int *n_out, kn_error *err) {
    const int eot = kn_whisper_cfg(w)->eos_token_id;
    *out = NULL, *n_out = 0;
    if (n_text < 1) return KN_OK;
    double *jumps = malloc(sizeof(double) * (size_t)(n_text + 1));
    double *probs = malloc(sizeof(double) * (size_t)n_text);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_text + 1));
    kn_word_span *words = NULL;
    int nw = 0;
    kn_code rc = jumps && probs && toks ? KN_OK : kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (!rc) rc = kn_word_jump_times(w, sot_seq, n_sot, text, n_text, n_frames, jumps, probs, err);
    if (!rc) {
        memcpy(toks, text, sizeof(int32_t) * (size_t)n_text);
        toks[n_text] = eot;
        rc = kn_word_split(detok, user, eot, toks, n_text + 1, by_unicode, &words, &nw, err);
    }
    /* the words of the text: the last one (holding <|endoftext|>) is dropped */
    if (!rc && nw <= 1) {
        kn_word_spans_free(words, nw);
        words = NULL, nw = 0;
    } else if (!rc) {
        nw--;
        free(words[nw].text);
        for (int i = 0; i < nw; i++) {
            int a = words[i].first, b = words[i].first + words[i].count;
            words[i].start = jumps[a];
            words[i].end = jumps[b <= n_text ? b : n_text];
            double p = 0;
            for (int k = a; k < b && k < n_text; k++) p += probs[k];
            words[i].probability = words[i].count ? p / words[i].count : 0.0;
        }
    }
    free(jumps), free(probs), free(toks);
    if (rc) {
        kn_word_spans_free(words, nw);
        return rc;
    }
    *out = words, *n_out = nw;
    return KN_OK;
}

/* ---- add_word_timestamps ------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double round2(double x) { return nearbyint(x * 100.0) / 100.0; }

static int lang_without_spaces(const char *l) {
    static const char *const ls[] = {"zh", "ja", "th", "lo", "my", "yue"};
    for (size_t i = 0; l && i < sizeof ls / sizeof *ls; i++)
        if (!strcmp(l, ls[i])) return 1;
    return 0;
}

kn_code kn_add_word_timestamps(kn_whisper *w, const kn_decode_options *o, const char *language, kn_segment *segs,
                               int n_segs, int n_frames, double time_offset, double *last_speech, kn_error *err) {
    const kn_whisper_config *c = kn_whisper_cfg(w);
    const int eot = c->eos_token_id;
    if (n_segs == 0) return KN_OK;
    if (!o->detok) return kn_fail(err, KN_ERR_INVALID_ARG, "word timestamps need a detokenizer");
    int n_text = 0;
    for (int s = 0; s < n_segs; s++)
        for (int k = 0; k < segs[s].n_tokens; k++) n_text += segs[s].tokens[k] < eot;
    int32_t *text = malloc(sizeof(int32_t) * (size_t)(n_text + 1));
    kn_word_span *words = NULL;
    int nw = 0;
    kn_code rc = text ? KN_OK : kn_fail(err, KN_ERR_NOMEM, "out of memory");
    if (rc) goto done;
    int m = 0;
    for (int s = 0; s < n_segs; s++)
        for (int k = 0; k < segs[s].n_tokens; k++)
            if (segs[s].tokens[k] < eot) text[m++] = segs[s].tokens[k];
    if (n_text == 0) goto done;
    /* the SOT sequence: <|startoftranscript|> [<|lang|> <|task|>] */
    int32_t sot[3];
    int n_sot = 0;
    sot[n_sot++] = c->decoder_start_token_id;
    if (c->n_langs > 0) {
        int lt = -1;
        for (int i = 0; i < c->n_langs; i++)
            if (language && !strcmp(c->lang_code[i], language)) lt = c->lang_token_id[i];
        if (lt < 0) lt = c->lang_token_id[0];
        int task = o->task == KN_TASK_TRANSLATE ? c->translate_token_id : c->transcribe_token_id;
        sot[n_sot++] = lt;
        if (task >= 0) sot[n_sot++] = task;
    }
    if ((rc = kn_word_find_alignment(w, sot, n_sot, text, n_text, n_frames, o->detok, o->detok_user,
                                     lang_without_spaces(language), &words, &nw, err)) ||
        nw == 0)
        goto done;
    /* median duration of the non-empty words; truncate long words at sentence ends */
    double *dur = malloc(sizeof(double) * (size_t)nw);
    if (!dur) {
        rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
        goto done;
    }
    int nd = 0;
    for (int i = 0; i < nw; i++)
        if (words[i].end - words[i].start != 0) dur[nd++] = words[i].end - words[i].start;
    double median = 0.0;
    if (nd > 0) {
        qsort(dur, (size_t)nd, sizeof *dur, cmp_double);
        median = nd % 2 ? dur[nd / 2] : (dur[nd / 2 - 1] + dur[nd / 2]) / 2.0;
    }
    free(dur);
    if (median > 0.7) median = 0.7;
    double max_dur = median * 2;
    static const char sentence_end[] = ".\xe3\x80\x82!\xef\xbc\x81?\xef\xbc\x9f";
    if (nd > 0)
        for (int i = 1; i < nw; i++)
            if (words[i].end - words[i].start > max_dur) {
                if (py_in(words[i].text, strlen(words[i].text), sentence_end)) words[i].end = words[i].start + max_dur;
                else if (py_in(words[i - 1].text, strlen(words[i - 1].text), sentence_end))
                    words[i].start = words[i].end - max_dur;
            }
    if ((rc = kn_word_merge_punctuations(words, nw, KN_PREPEND_PUNCTUATIONS, KN_APPEND_PUNCTUATIONS, err))) goto done;
    /* hand the words to the segments by token count */
    int wi = 0;
    for (int s = 0; s < n_segs && !rc; s++) {
        kn_segment *g = &segs[s];
        int seg_text = 0;
        for (int k = 0; k < g->n_tokens; k++) seg_text += g->tokens[k] < eot;
        int saved = 0, first_w = wi;
        int n_out = 0;
        for (int k = wi; k < nw && saved < seg_text; k++) saved += words[k].count, n_out += words[k].text[0] != 0;
        g->words = n_out ? calloc((size_t)n_out, sizeof(kn_word)) : NULL;
        if (n_out && !g->words) {
            rc = kn_fail(err, KN_ERR_NOMEM, "out of memory");
            break;
        }
        saved = 0;
        while (wi < nw && saved < seg_text) {
            kn_word_span *t = &words[wi];
            if (t->text[0]) {
                kn_word *o2 = &g->words[g->n_words++];
                o2->word = t->text;
                t->text = NULL;
                o2->start = round2(time_offset + t->start);
                o2->end = round2(time_offset + t->end);
                o2->probability = t->probability;
            }
            saved += t->count;
            wi++;
        }
        (void)first_w;
        if (g->n_words == 0) continue;
        kn_word *ws = g->words;
        int n = g->n_words;
        /* the first (and second) word after a pause is at most twice the median long */
        if (ws[0].end - *last_speech > median * 4 &&
            (ws[0].end - ws[0].start > max_dur || (n > 1 && ws[1].end - ws[0].start > max_dur * 2))) {
            if (n > 1 && ws[1].end - ws[1].start > max_dur) {
                double boundary = fmax(ws[1].end / 2, ws[1].end - max_dur);
                ws[0].end = ws[1].start = boundary;
            }
            ws[0].start = fmax(0.0, ws[0].end - max_dur);
        }
        /* prefer the segment-level start / end timestamp if the first / last word is too long */
        if (g->start < ws[0].end && g->start - 0.5 > ws[0].start)
            ws[0].start = fmax(0.0, fmin(ws[0].end - median, g->start));
        else g->start = ws[0].start;
        if (g->end > ws[n - 1].start && g->end + 0.5 < ws[n - 1].end)
            ws[n - 1].end = fmax(ws[n - 1].start + median, g->end);
        else g->end = ws[n - 1].end;
        *last_speech = g->end;
    }
done:
    kn_word_spans_free(words, nw);
    free(text);
    return rc;
}
