"""HTTP API: thin routes over the store, with problem-details errors and bearer-token roles."""
