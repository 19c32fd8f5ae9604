"""`circuitlab serve`: a local web explorer for a checkpoint, and the hand-built adder page.

    from circuitlab.serve import create_app
    app = create_app("runs/demo/2l")        # FastAPI; run with uvicorn or test with TestClient

See docs/serve.md for the pages, the JSON API and the limits.
"""
from circuitlab.serve.app import create_app

__all__ = ["create_app"]
