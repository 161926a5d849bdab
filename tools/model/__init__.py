"""The embedded default model: an offline-built target LLM and two EAGLE-3 drafters.

Everything here is reproducible from the running interpreter's standard library
(no network): `build.py` trains the tokenizer, the target and both drafters,
`measure.py` measures acceptance through vLLM; where the committed artifacts live
is `engine.model_paths` (the runtime reads it).
"""
