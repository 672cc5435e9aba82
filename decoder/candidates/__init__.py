"""Free candidates: suffix lookup over the text so far and earlier outputs, merged into the drafted tree."""
