"""``gptforge serve``: a local web page and JSON API around one model (see ``app.py``)."""
