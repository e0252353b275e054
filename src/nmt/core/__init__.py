"""What several stages share, and nothing that knows the pipeline around it.

Batching (data), the vocabulary's codecs (codecs: specials, encode, decode), text files and
spaCy tokenization (text), decoding (greedy and beam), the loss, device, seeding and autocast
(runtime), checkpoints, run folders (runs), the CTranslate2 engine (engine), <unk>
replacement (unknowns), statistics (stats), atomic files (files) and errors. What only
training uses lives in nmt.training.

May import: nmt.models, and other modules of nmt.core. Never nmt.training, nmt.pipeline,
nmt.stages, nmt.commands or nmt.cli (tests/test_layout.py holds the direction).
"""
