"""Planning inputs read without tensor bytes: checkpoint headers and the model's tensor metadata."""
