"""``python -m draftscope``: the ``draftscope`` console script."""

from draftscope.cli.main import main

main()
