"""Model architectures and GPU types (data in `fixtures/catalog/`) and the memory fit over them.

`plan_fit(FitRequest) -> FitReport` is the entry point; `load_catalog()` reads the catalog and
`parse_hf_config()` reads any Hugging Face `config.json`. The memory arithmetic itself lives in
`controlplane.policies.memory`.
"""
