"""Runnable examples: the demo (`make demo`), a FastAPI app and a Django site that embed
duetime's dispatcher and worker (docs/embedding.md). A package so that the tests, which
run each one, can import the FastAPI app as ``examples.fastapi_app``."""
