"""What training recipes hold (their scripts' flags and settings), turned into Loader options."""
