"""The ledger of what each rank delivered, and the audit that checks an epoch was exactly once."""
