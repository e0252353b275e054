"""The decoder-only (GPT-style) translator: one file per block, as in the scratch package
(model: DecoderOnlyTransformer; block, attention, feed_forward, embedding, layer_norm; size:
its layer count and parameter counts). Import the block's module: this package imports none."""
