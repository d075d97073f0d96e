"""Models to and from other toolkits' formats. Export to inference engines: ``python -m
transformer.export ct2 CKPT [CKPT ...] OUT_DIR``, and to Hugging Face transformers: ``python -m
transformer.export hf CKPT [CKPT ...] OUT_DIR``; import from a Hugging Face MarianMT (OPUS-MT)
directory: ``python -m transformer.export.hf_import DIR OUT.ckpt``.

:mod:`transformer.export.ct2` converts a checkpoint (or the average of several) to a CTranslate2
model directory; :mod:`transformer.export.ct2_translate` translates with one as
:class:`transformer.translate.Translator` does (``evaluate.py engine=ctranslate2``). CTranslate2 is
optional (``pip install -e ".[export]"``) and imported only when used. :mod:`transformer.export.hf`
writes a MarianMT directory (the reverse of :mod:`transformer.export.hf_import`; the format's
mapping to ours in :mod:`transformer.export.marian` and :mod:`transformer.export.marian_vocab`); it
needs safetensors (``pip install -e ".[hf]"``).
"""
