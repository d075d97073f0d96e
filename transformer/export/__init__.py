"""Export to inference engines: ``python -m transformer.export ct2 CKPT [CKPT ...] OUT_DIR``, and
to Hugging Face transformers: ``python -m transformer.export hf CKPT [CKPT ...] OUT_DIR``.

:mod:`transformer.export.ct2` converts a checkpoint (or the average of several) to a CTranslate2
model directory; :mod:`transformer.export.ct2_translate` translates with one as
:class:`transformer.translate.Translator` does (``evaluate.py engine=ctranslate2``). CTranslate2
is optional (``pip install -e ".[export]"``) and imported only when used.
:mod:`transformer.export.hf` writes a MarianMT directory (the reverse of
:mod:`transformer.import_hf`); it needs safetensors (``pip install -e ".[hf]"``).
"""
