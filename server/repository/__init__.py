"""Writing a Triton model repository for one hub-vit classifier (`hub-vit repository`), and reading one back.

* `options`: `ServingOptions`, the repository's knobs and defaults (light: the CLI reads it when it starts).
* `metadata`: what a repository needs to know of the served model (labels, eval transform) -> `ServingMetadata`.
* `config`: `config.pbtxt` rendering (Triton's ModelConfig protobuf) from that metadata and those options.
* `cpu_variant`: which graph the CPU flavour serves on this host (the fastest that passes verification).
* `writer`: writes the repository, an ensemble clients call, atomically; `manifest`: reads a written one's record.
* `templates/`: the Python-backend `model.py` files (and the modules they import) copied into repositories;
  `torch_runner`: the torch flavour's forward pass, which its template imports.
"""
