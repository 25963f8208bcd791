"""`tessera serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the engine.

One background thread owns the Engine and its workers and runs the engine's loop step
(``tessera.engine.serve.Loop``); request handlers hand it requests through a thread-safe queue and read
their tokens from per-request asyncio queues (``loop``). ``protocol`` is the request and response
contract (OpenAI's JSON), ``metrics`` the Prometheus figures, ``app`` the endpoints, ``launch`` the
engine, workers and uvicorn put together for the command (``cli``).
"""
