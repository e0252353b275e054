"""A GPT-style decoder-only translator over <bos> source <eos> <sep> target."""

from nmt.models.registry import ModelEntry

ENTRY = ModelEntry(
    "decoder_only", order=2, model="nmt.models.decoder_only.model:DecoderOnlyTransformer",
    encoder_decoder=False, reads_bos=True, exports=False,
    param_count="nmt.models.decoder_only.size:decoder_only_param_count",
    checks=("decoder_only",))
