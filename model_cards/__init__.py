"""hub_vit.model_cards"""
