"""The model repository: scanning folders and owning every model's lifecycle."""
