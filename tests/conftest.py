"""Fixtures live in tests/fixtures/, one module per resource; this file only registers them."""

pytest_plugins = [
    "tests.fixtures.store",
    "tests.fixtures.sglang_server",
    "tests.fixtures.vllm_server",
    "tests.fixtures.demo_store",
    "tests.fixtures.disk",
    "tests.fixtures.bundles",
    "tests.fixtures.compose",
]
