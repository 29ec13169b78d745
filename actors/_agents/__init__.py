"""_agents"""
