"""One module per ``tilefeed bench`` form: each measures one thing and returns its result."""
