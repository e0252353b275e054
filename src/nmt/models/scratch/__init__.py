"""The Transformer written from scratch: one module per block of the paper's Figure 1
(embedding, attention, feed_forward, encoder, decoder, transformer: ScratchTransformer; dropout,
rotary). Import the block's module: this package imports none of them, so a model that takes
one block (the decoder-only one: attention, dropout, feed_forward) runs that block's code only,
and an edit of another re-runs none of its runs (nmt.pipeline.code)."""
