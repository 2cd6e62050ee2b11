"""First-time chat questions: what a new user types into a chat box, never seen before.

Text that no earlier request repeats is where the suffix trees have nothing to draft from,
so these questions measure draft sources that do not rely on repetition (the target's own
top-k, recycled: ``suffix/recycling.py``). 48 questions written for this project (none
copied from a dataset or from the committed traces' prompts), in varied domains: science,
history, cooking, travel, programming concepts in prose, personal advice, math word
problems, definitions, comparisons and short creative requests, split into two halves of
24 with the same mix of domains.

``TUNING`` is the half that settings may be chosen on. ``HELD_OUT`` is never used to
choose settings: it only reports how the chosen ones do on questions they were not tuned
on. ``benchmarks/make_topk_traces.py`` records the target's greedy answers to both (sets
``first-time-tuning`` and ``first-time-held-out``).
"""

from __future__ import annotations

#: Settings may be chosen on these (set ``first-time-tuning``).
TUNING: tuple[str, ...] = (
    "Why does bread dough need to rest before it is baked?",
    "What causes the seasons on Earth, and why are they reversed between the northern "
    "and southern hemispheres?",
    "Who was Hammurabi, and why is his code of laws still remembered today?",
    "I have three days in Lisbon in early spring. What would you suggest I see and eat?",
    "Explain in plain words what a hash table is and why looking something up in one "
    "is fast. Please do not write any code.",
    "My roommate keeps leaving dirty dishes in the sink. How can I bring it up without "
    "starting a fight?",
    "A train leaves at 2:15 pm and travels 180 kilometres at 72 kilometres per hour. "
    "At what time does it arrive?",
    'What does the word "photosynthesis" mean?',
    "What is the difference between a crocodile and an alligator?",
    "Write a four-line poem about a lighthouse keeper's last night on the job.",
    "How do vaccines teach the immune system to recognise a virus?",
    "What were the main reasons the Western Roman Empire fell?",
    "How can I keep fresh herbs like basil and parsley from wilting so quickly?",
    "What should I pack for a week of hiking in the Scottish Highlands in September?",
    "What is recursion in programming? Explain the idea in prose, without code.",
    "I'm nervous about starting a new job next week. Any tips for the first few days?",
    "A rectangular garden is 12 metres long and 7 metres wide. How much fencing do I "
    "need to go all the way around it, and what is its area?",
    "What is compound interest, and why does it matter for a savings account?",
    "Which is easier for an adult beginner to learn, the piano or the guitar?",
    "Write a short bedtime story about a hedgehog who is afraid of the dark.",
    "Why is the sky blue during the day but red and orange at sunset?",
    "How did the printing press change everyday life in Europe?",
    "What is the difference between baking soda and baking powder?",
    "Give me three birthday gift ideas for a friend who loves gardening.",
)

#: Never used to choose settings (set ``first-time-held-out``).
HELD_OUT: tuple[str, ...] = (
    "How do bees make honey?",
    "What happened during the Cuban Missile Crisis, and how was it resolved?",
    "How do I cook rice on the stove so that it comes out fluffy instead of sticky?",
    "What is the best way to get around Tokyo on a first visit?",
    "What is the difference between a compiler and an interpreter? Explain it in prose.",
    "How can I stop procrastinating when I have to study for an exam?",
    "If five workers can paint a fence in six hours, how long would three workers take "
    "at the same pace?",
    "What is a black hole?",
    "How is a virus different from a bacterium?",
    "Write a limerick about a cat who learns to use a computer.",
    "Why do leaves change colour in autumn?",
    "What was the Silk Road, and which goods travelled along it?",
    "Give me a simple recipe for vegetable soup using things I probably already have at home.",
    "I am visiting Rome for the first time. Which sights are worth booking in advance?",
    "What does it mean when a website uses encryption, and why does it matter?",
    "How do I politely say no when a coworker keeps asking me to cover their shifts?",
    "A shirt costs 40 dollars and is 25 percent off. If 8 percent sales tax is added "
    "after the discount, how much do I pay?",
    'What does the term "biodiversity" mean, and why do scientists care about it?',
    "What are the pros and cons of renting a home compared with buying one?",
    "Write a short dialogue between a robot and a child who meet for the first time.",
    "How do ocean tides work?",
    "Who was Ada Lovelace, and what is she known for?",
    "What is the difference between a latte and a cappuccino?",
    "Can you suggest a simple evening routine to help me sleep better?",
)

#: Trace set name -> its questions.
SETS: dict[str, tuple[str, ...]] = {
    "first-time-tuning": TUNING,
    "first-time-held-out": HELD_OUT,
}
