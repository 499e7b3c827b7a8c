"""A plan as another engine's configuration (``espresso export torchtitan|megatron``):
:mod:`.torchtitan` writes torchtitan's job config (TOML) and Megatron-LM's
``pretrain_gpt.py`` arguments come from :mod:`.megatron`; both refuse a plan their engine
cannot run (:func:`espresso.engines.refusal`). Imports nothing on its own."""
