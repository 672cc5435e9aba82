"""What a decode writes and returns: the node-log schema and writer, atomic files, typed results."""
