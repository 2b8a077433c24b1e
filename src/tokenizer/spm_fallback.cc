// spm_fallback.cc — the C face of libsentencepiece for tokenizer.model-only
// checkpoints (see spm_fallback.h). Every C++ exception or error status is
// turned into a return code and one line of text; nothing escapes into C.
#include "tokenizer/spm_fallback.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

struct kn_spm {
    sentencepiece::SentencePieceProcessor sp;
};

static void set_err(char *err, size_t n, const std::string &msg) {
    if (err && n) std::snprintf(err, n, "%s", msg.c_str());
}

extern "C" int kn_spm_load(const char *path, kn_spm **out, char *err, size_t err_len) {
    *out = nullptr;
    try {
        kn_spm *s = new kn_spm;
        auto st = s->sp.Load(path);
        if (!st.ok()) {
            set_err(err, err_len, std::string(path) + ": " + st.ToString());
            delete s;
            return -1;
        }
        *out = s;
        return 0;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string(path) + ": " + e.what());
        return -1;
    }
}

extern "C" void kn_spm_free(kn_spm *s) { delete s; }

extern "C" int kn_spm_encode(const kn_spm *s, const char *text, size_t len, int add_bos, int32_t **ids, int *n_ids,
                             char *err, size_t err_len) {
    *ids = nullptr;
    *n_ids = 0;
    try {
        std::vector<int> v;
        auto st = s->sp.Encode(std::string_view(text, len), &v);
        if (!st.ok()) {
            set_err(err, err_len, "sentencepiece encode: " + st.ToString());
            return -1;
        }
        int bos = s->sp.bos_id();
        size_t extra = add_bos && bos >= 0 ? 1 : 0;
        int32_t *out = static_cast<int32_t *>(std::malloc(sizeof(int32_t) * (v.size() + extra + 1)));
        if (!out) {
            set_err(err, err_len, "out of memory");
            return -1;
        }
        if (extra) out[0] = bos;
        for (size_t i = 0; i < v.size(); i++) out[extra + i] = v[i];
        *ids = out;
        *n_ids = static_cast<int>(v.size() + extra);
        return 0;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("sentencepiece encode: ") + e.what());
        return -1;
    }
}

extern "C" int kn_spm_decode(const kn_spm *s, const int32_t *ids, int n_ids, char **text, size_t *len, char *err,
                             size_t err_len) {
    *text = nullptr;
    try {
        std::vector<int> v(ids, ids + n_ids);
        std::string out;
        auto st = s->sp.Decode(v, &out);
        if (!st.ok()) {
            set_err(err, err_len, "sentencepiece decode: " + st.ToString());
            return -1;
        }
        char *t = static_cast<char *>(std::malloc(out.size() + 1));
        if (!t) {
            set_err(err, err_len, "out of memory");
            return -1;
        }
        std::memcpy(t, out.data(), out.size());
        t[out.size()] = 0;
        *text = t;
        if (len) *len = out.size();
        return 0;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("sentencepiece decode: ") + e.what());
        return -1;
    }
}

extern "C" int kn_spm_piece_count(const kn_spm *s) { return s->sp.GetPieceSize(); }

extern "C" const char *kn_spm_piece(const kn_spm *s, int id, size_t *len) {
    const std::string &p = s->sp.IdToPiece(id);
    if (len) *len = p.size();
    return p.c_str();
}

extern "C" int kn_spm_is_control(const kn_spm *s, int id) { return s->sp.IsControl(id); }
extern "C" int kn_spm_is_byte(const kn_spm *s, int id) { return s->sp.IsByte(id); }
