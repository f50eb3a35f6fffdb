# The two commands of the README: `make demo` and `make test`.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE ?= cmake

.PHONY: deps build quiet-build test demo bench clean

deps:
	@scripts/install-deps.sh

build: deps
	@$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@$(CMAKE) --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The build's output only when it fails (the demo's own lines are what a user reads).
quiet-build: deps
	@echo "building shardlm in $(BUILD_DIR) (output shown only on failure)..."
	@log=$$(mktemp); \
	  if $(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >"$$log" 2>&1 && \
	     $(CMAKE) --build $(BUILD_DIR) -j $(JOBS) >>"$$log" 2>&1; then rm -f "$$log"; \
	  else cat "$$log"; rm -f "$$log"; echo "make: the build failed (its output is above)"; exit 1; fi

demo: quiet-build
	@scripts/demo.sh $(BUILD_DIR)/shardlm

clean:
	rm -rf $(BUILD_DIR)
