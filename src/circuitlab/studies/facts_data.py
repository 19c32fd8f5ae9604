"""The facts the facts study traces: (prompt, subject, answer), the subject a span of the prompt's words and the
answer one word the prompt is completed with (its token is " " + answer). Capitals, landmarks, languages,
companies and people, written here in the style of Meng et al.'s CounterFact prompts (the subject early, so that
the prompt has tokens after it). Which answers are one token in a model's tokenizer, and which facts the model
gets right, is checked when the study runs (studies/facts.py), not assumed here.
"""
from __future__ import annotations

FACTS: tuple[tuple[str, str, str], ...] = (
    # landmarks -> city
    ("The Eiffel Tower is located in the city of", "The Eiffel Tower", "Paris"),
    ("The Colosseum is located in the city of", "The Colosseum", "Rome"),
    ("Big Ben is located in the city of", "Big Ben", "London"),
    ("The Kremlin is located in the city of", "The Kremlin", "Moscow"),
    ("The Brandenburg Gate is located in the city of", "The Brandenburg Gate", "Berlin"),
    ("The Acropolis is located in the city of", "The Acropolis", "Athens"),
    ("The Sagrada Familia is located in the city of", "The Sagrada Familia", "Barcelona"),
    ("The Forbidden City is located in the city of", "The Forbidden City", "Beijing"),
    ("The Louvre museum is located in the city of", "The Louvre museum", "Paris"),
    ("Buckingham Palace is located in the city of", "Buckingham Palace", "London"),
    ("The Vatican is located in the city of", "The Vatican", "Rome"),
    ("The Space Needle is located in the city of", "The Space Needle", "Seattle"),
    ("The Hollywood sign is located in the city of", "The Hollywood sign", "Los"),
    # landmarks -> country
    ("Mount Fuji is located in the country of", "Mount Fuji", "Japan"),
    ("The Great Wall is located in the country of", "The Great Wall", "China"),
    ("The pyramids of Giza are located in the country of", "The pyramids of Giza", "Egypt"),
    ("The Taj Mahal is located in the country of", "The Taj Mahal", "India"),
    ("Machu Picchu is located in the country of", "Machu Picchu", "Peru"),
    ("The Sydney Opera House is located in the country of", "The Sydney Opera House", "Australia"),
    ("Stonehenge is located in the country of", "Stonehenge", "England"),
    ("The Leaning Tower of Pisa is located in the country of", "The Leaning Tower of Pisa", "Italy"),
    ("Niagara Falls is located on the border of the United States and", "Niagara Falls", "Canada"),
    # countries -> capital
    ("The capital of France is the city of", "France", "Paris"),
    ("The capital of Italy is the city of", "Italy", "Rome"),
    ("The capital of Spain is the city of", "Spain", "Madrid"),
    ("The capital of Germany is the city of", "Germany", "Berlin"),
    ("The capital of Japan is the city of", "Japan", "Tokyo"),
    ("The capital of Russia is the city of", "Russia", "Moscow"),
    ("The capital of Egypt is the city of", "Egypt", "Cairo"),
    ("The capital of Greece is the city of", "Greece", "Athens"),
    ("The capital of Portugal is the city of", "Portugal", "Lisbon"),
    ("The capital of Austria is the city of", "Austria", "Vienna"),
    ("The capital of Ireland is the city of", "Ireland", "Dublin"),
    ("The capital of Norway is the city of", "Norway", "Oslo"),
    ("The capital of Sweden is the city of", "Sweden", "Stockholm"),
    ("The capital of Poland is the city of", "Poland", "Warsaw"),
    ("The capital of Canada is the city of", "Canada", "Ottawa"),
    ("The capital of Australia is the city of", "Australia", "Canberra"),
    ("The capital of Kenya is the city of", "Kenya", "Nairobi"),
    ("The capital of Thailand is the city of", "Thailand", "Bangkok"),
    ("The capital of England is the city of", "England", "London"),
    ("The capital of China is the city of", "China", "Beijing"),
    # languages
    ("The official language of Brazil is", "Brazil", "Portuguese"),
    ("The official language of Mexico is", "Mexico", "Spanish"),
    ("The official language of France is", "France", "French"),
    ("The official language of Germany is", "Germany", "German"),
    ("The official language of Japan is", "Japan", "Japanese"),
    ("The official language of Italy is", "Italy", "Italian"),
    ("The official language of Russia is", "Russia", "Russian"),
    ("The mother tongue of Vladimir Putin is", "Vladimir Putin", "Russian"),
    # companies
    ("The iPhone is a smartphone made by the company", "The iPhone", "Apple"),
    ("The Windows operating system is developed by the company", "The Windows operating system", "Microsoft"),
    ("The PlayStation game console is made by the company", "The PlayStation game console", "Sony"),
    ("The Android operating system is developed by the company", "The Android operating system", "Google"),
    ("The Corolla is a car made by the company", "The Corolla", "Toyota"),
    ("The Model S is an electric car made by the company", "The Model S", "Tesla"),
    ("The Galaxy smartphone is made by the company", "The Galaxy smartphone", "Samsung"),
    ("The Big Mac is sold by the restaurant chain", "The Big Mac", "McDonald"),
    # people
    ("Albert Einstein was born in the country of", "Albert Einstein", "Germany"),
    ("William Shakespeare was born in the country of", "William Shakespeare", "England"),
    ("Leonardo da Vinci was born in the country of", "Leonardo da Vinci", "Italy"),
    ("Barack Obama was born in the state of", "Barack Obama", "Hawaii"),
)
