"""``gptforge serve``: a local web page and JSON API around one model (the app is in ``app.py``).

    gptforge serve --ckpt runs/shakespeare-cpu --port 8000
"""
