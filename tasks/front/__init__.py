"""The HTTP front door: predictions in the manner of cog and Replicate, for callers who
hold an API key (``celery -A tasks lanes api``; the reference is docs/http-api.md).

An ASGI app (FastAPI) built by :func:`tasks.front.app.create_app`, served by uvicorn
(``tasks.front.serve``). It submits through ``tasks.submit`` and reads results and
artifacts; it never loads a model.
"""
