"""How SMs are split: SGLang's PD-mux rules and YAML, level policies, partitions, advice."""
