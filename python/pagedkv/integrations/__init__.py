"""Glue between pagedkv and other libraries.

Each submodule imports its library (torch, transformers, ...) itself, so `import pagedkv` and
`import pagedkv.integrations` never need them; `import pagedkv.integrations.transformers`
does (docs/transformers.md).
"""
