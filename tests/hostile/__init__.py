"""The hostile tests, one module per guarantee of docs/guarantees.md that model-written code or untrusted text attacks."""
