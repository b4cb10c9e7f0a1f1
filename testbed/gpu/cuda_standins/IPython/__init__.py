"""``IPython`` stand-in: ``sglang/utils.py`` imports ``IPython.display`` at import time."""
