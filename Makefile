# Two entry points on a fresh Debian 12 machine (as root, or with sudo):
#   make run    set up, build in release mode, run pipelines/demo.toml (writes out/)
#   make test   set up, then the whole test suite (what CI runs)

CARGO ?= cargo
VIDFLOW_RELEASE := target/release/vidflow

.PHONY: run test setup deps assets build install clean

run: setup
	$(CARGO) build --release --locked
	$(VIDFLOW_RELEASE) run pipelines/demo.toml --stats-json out/stats.json

test: setup
	scripts/test

setup: deps assets

deps:
	scripts/install-deps

assets: deps
	scripts/fetch-assets

build:
	$(CARGO) build --release --locked

# Installs the binary, the systemd unit, the models (fetched by `make assets`, found by the
# unit through VIDFLOW_MODELS_DIR) and the inference runtimes (scripts/fetch-runtimes, found
# through VIDFLOW_RUNTIMES_DIR, and beside the binary); pipelines go in /etc/vidflow/NAME.toml.
MODELS_DIR := /usr/local/share/vidflow/models
RUNTIMES_DIR := /usr/local/lib/vidflow/runtimes

install: build assets
	install -D -m 0755 $(VIDFLOW_RELEASE) $(DESTDIR)/usr/local/bin/vidflow
	install -D -m 0644 systemd/vidflow@.service $(DESTDIR)/etc/systemd/system/vidflow@.service
	install -d -m 0755 $(DESTDIR)/etc/vidflow $(DESTDIR)$(MODELS_DIR)
	install -m 0644 models/models.toml $$(ls models/*.onnx models/*.weights models/*.cfg models/*.names models/*.png 2>/dev/null) $(DESTDIR)$(MODELS_DIR)/
	install -d -m 0755 $(DESTDIR)$(RUNTIMES_DIR)
	cp -R runtimes/onnxruntime runtimes/openvino $(DESTDIR)$(RUNTIMES_DIR)/
	[ -n "$(DESTDIR)" ] || ! command -v systemctl >/dev/null || systemctl daemon-reload 2>/dev/null || true

clean:
	$(CARGO) clean
	rm -rf out
