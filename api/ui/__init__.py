"""The operator UI at `/ui`: server-rendered pages (Jinja2), live parts over SSE, no build step.

`login` turns a bearer token into the UI's cookie and guards every page (admin scope); `views`
gathers what a page shows from Redis, always a bounded amount; `routes` serves the pages and their
actions; `templates/` and `static/` are the pages and the one small script that makes them live.
"""
