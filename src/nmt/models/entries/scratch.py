"""The same Transformer written from scratch, one module a block: the reference's twin."""

from nmt.models.registry import PROPERTY_CHECKS, TWIN_CHECKS, ModelEntry

ENTRY = ModelEntry(
    "scratch", order=1, model="nmt.models.scratch.transformer:ScratchTransformer",
    encoder_decoder=True, reads_bos=False, exports=True,
    param_count="nmt.models.decoder_only.size:encoder_decoder_param_count",
    checks=(TWIN_CHECKS, PROPERTY_CHECKS), positions=("sinusoidal", "rotary"),
    takes_reference_weights=True)
