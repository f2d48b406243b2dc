"""The reference trainer: records -> tensors (`batch`), loss terms (`losses`), the optimiser step
(`trainer`), refreshing the served weights (`refresh`). It reads records, never env internals."""
