"""Is this rented machine any good, and is my job using it well: doctor, bench, watch and their advice."""
