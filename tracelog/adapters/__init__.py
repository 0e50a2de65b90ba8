"""Framework adapters: each records a framework's ops into the IR."""
