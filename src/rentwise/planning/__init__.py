"""Planning: what to rent, how long a fine-tune takes, what it really costs (offers, time, cost, rank)."""
