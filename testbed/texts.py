"""The texts of the test bed: the sentences the tiny tokenizer is trained on and the demo prompts.

The lowest module of ``testbed/``: the models are built from these texts (``models``, ``train_draft``)
and the scenarios' servers are asked the demo prompts (``scenarios``, the tests, the GPU runner).
"""

TOKENIZER_CORPUS = [
    "Hello world, this is a tiny model that speaks in bytes.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a draft model that guessed the next words.",
    "Speculative decoding lets a small draft propose tokens that a large target verifies.",
    "In the beginning the server started, and every request came back with tokens.",
    "A cat sat on the mat and watched the rain fall on the window.",
    "Numbers like 1, 2, 3 and 42 appear in text; so do questions? Yes!",
]

# Greedy demo prompts, DEMO_NEW_TOKENS new tokens each. Picked so that the tiny target's greedy
# continuation never repeats a token more than twice in a row: in a run of one token any draft
# guesses right whatever it is fed, which would hide a broken draft.
DEMO_PROMPTS = [
    "Once upon a time",
    "The draft model guessed",
    "Tokens that the server",
    "Once there was a server",
    "The rain fell on the window",
    "Bytes and tokens",
]
DEMO_NEW_TOKENS = 32
