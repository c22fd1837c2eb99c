"""The fleet page: one server-rendered HTML shell (``templates/``), hand-written JS and
CSS (``static/``, served locally: no build step, no CDN), and the read models it polls."""
