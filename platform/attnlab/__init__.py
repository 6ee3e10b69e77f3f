"""attnlab: compare and ablate transformer families with Lightning."""
