"""Reading weights: masks, checkpoint streams, localization scores, FRAG and behavioural metrics."""
