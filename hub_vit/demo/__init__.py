"""hub_vit.demo"""
